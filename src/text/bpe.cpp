// The BPE model of `tokenizers` (src/models/bpe/{model,word}.rs): each piece is split into
// characters (with continuing_subword_prefix / end_of_word_suffix), unknown characters go
// to <0xNN> byte tokens (byte_fallback) or to unk (fused when fuse_unk), then merges are
// applied lowest rank first (ties: leftmost) through a priority queue over a linked list
// of symbols. ignore_merges returns a piece that is itself in the vocabulary as one token.
// Results are cached per thread for pieces under 256 bytes, like the Rust BPE cache.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <list>

#include "text/model.h"
#include "text/unicode.h"

namespace moe::text {

using js::json;

void Vocab::build(std::vector<std::pair<std::string, int64_t>> entries, const std::string& where) {
  MOE_CHECK(entries.size() <= kMaxVocabEntries, "{}: vocabulary has {} entries, more than the supported {}", where,
            entries.size(), kMaxVocabEntries);
  map_ = FlatStrMap{};
  map_.reserve(entries.size());
  int64_t max_id = -1;
  for (auto& [tok, id] : entries) {
    MOE_CHECK(id >= 0 && id < (int64_t{1} << 31), "{}: token '{}' has id {}, outside [0, 2^31)", where, tok, id);
    max_id = std::max(max_id, id);
    map_.insert(tok, static_cast<int32_t>(id));
  }
  end_id_ = max_id + 1;
  by_id_.clear();
  has_.clear();
  sparse_.clear();
  const bool dense = end_id_ <= static_cast<int64_t>(2 * map_.size() + 65536);
  if (dense) {
    by_id_.resize(static_cast<size_t>(end_id_));
    has_.assign(static_cast<size_t>(end_id_), 0);
  }
  map_.for_each([&](std::string_view tok, int32_t id) {
    std::string* prev = nullptr;
    if (dense) {
      if (has_[static_cast<size_t>(id)]) prev = &by_id_[static_cast<size_t>(id)];
    } else if (auto it = sparse_.find(id); it != sparse_.end()) {
      prev = &it->second;
    }
    MOE_CHECK(prev == nullptr, "{}: id {} is used by two tokens ('{}' and '{}'); ids must be unique", where, id,
              *prev, tok);
    if (dense) {
      by_id_[static_cast<size_t>(id)] = std::string(tok);
      has_[static_cast<size_t>(id)] = 1;
    } else {
      sparse_.emplace(id, std::string(tok));
    }
  });
}

const std::string* Vocab::token(int32_t id) const {
  if (id < 0) return nullptr;
  if (!has_.empty() || sparse_.empty())
    return static_cast<size_t>(id) < has_.size() && has_[static_cast<size_t>(id)] ? &by_id_[static_cast<size_t>(id)]
                                                                                   : nullptr;
  auto it = sparse_.find(id);
  return it == sparse_.end() ? nullptr : &it->second;
}

std::vector<std::pair<std::string, int64_t>> read_vocab_map(const json& model, ParsedVocab* side,
                                                            const std::string& where) {
  if (side && side->collected) {
    side->collected = false;
    return std::move(side->entries);
  }
  const json& v = js::req(model, "vocab", where);
  MOE_CHECK(v.is_object(), "{}: 'vocab' must be an object mapping tokens to ids", where);
  MOE_CHECK(v.size() <= kMaxVocabEntries, "{}: vocabulary has {} entries, more than the supported {}", where,
            v.size(), kMaxVocabEntries);
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    MOE_CHECK(it.value().is_number_integer(), "{}: vocab entry '{}' must map to an integer id", where, it.key());
    out.emplace_back(it.key(), it.value().get<int64_t>());
  }
  return out;
}

namespace {

constexpr size_t kCacheMaxLen = 256;       // tokenizers' MAX_LENGTH
constexpr size_t kCacheCapacity = 10'000;  // tokenizers' DEFAULT_CACHE_CAPACITY

std::atomic<uint64_t> g_next_cache_id{1};

// Merged words of one BPE instance: word -> its ids in an arena. Insert-only and bounded
// like tokenizers' cache (it stops growing at kCacheCapacity words).
struct WordCache {
  FlatStrMap index;  // word -> entry
  std::vector<std::pair<uint32_t, uint32_t>> entries;  // (offset, count) in ids
  std::vector<int32_t> ids;
};

// The calling thread's cache of one BPE instance. A thread keeps the caches of the few
// instances it used last, so destroyed tokenizers do not pile up.
WordCache& thread_cache(uint64_t id) {
  thread_local std::list<std::pair<uint64_t, WordCache>> caches;
  for (auto it = caches.begin(); it != caches.end(); ++it) {
    if (it->first == id) {
      if (it != caches.begin()) caches.splice(caches.begin(), caches, it);
      return caches.front().second;
    }
  }
  caches.emplace_front(id, WordCache{});
  if (caches.size() > 8) caches.pop_back();
  return caches.front().second;
}

// A merge candidate: the pair starting at symbol `pos`, ordered lowest rank first, then
// leftmost (key = rank << 32 | pos), as tokenizers' Merge ordering.
struct Cand {
  uint64_t key;
  int32_t new_id;
  uint32_t rank() const { return static_cast<uint32_t>(key >> 32); }
  uint32_t pos() const { return static_cast<uint32_t>(key); }
};

// 4-ary min-heap of candidates (fewer levels than a binary heap: a Mixtral-style tokenizer
// without pre-tokenizer makes the whole text one word, with a candidate per character).
class QuadHeap {
 public:
  void clear() { v_.clear(); }
  bool empty() const { return v_.empty(); }
  void push_unordered(Cand c) { v_.push_back(c); }
  void heapify() {
    if (v_.size() < 2) return;
    for (size_t i = (v_.size() - 2) / 4 + 1; i-- > 0;) down(i);
  }
  void push(Cand c) {
    v_.push_back(c);
    size_t i = v_.size() - 1;
    while (i > 0) {
      const size_t p = (i - 1) / 4;
      if (v_[p].key <= c.key) break;
      v_[i] = v_[p];
      i = p;
    }
    v_[i] = c;
  }
  Cand pop() {
    const Cand top = v_[0];
    v_[0] = v_.back();
    v_.pop_back();
    if (!v_.empty()) down(0);
    return top;
  }

 private:
  void down(size_t i) {
    const Cand x = v_[i];
    const size_t n = v_.size();
    while (true) {
      const size_t c = 4 * i + 1;
      if (c >= n) break;
      size_t best = c;
      const size_t end = std::min(c + 4, n);
      for (size_t k = c + 1; k < end; ++k)
        if (v_[k].key < v_[best].key) best = k;
      if (v_[best].key >= x.key) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = x;
  }
  std::vector<Cand> v_;
};

uint64_t cand_key(uint32_t rank, size_t pos) { return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos); }

class BPE final : public Model {
 public:
  Vocab vocab;
  struct MergeVal {
    uint32_t rank;
    int32_t new_id;
  };
  FlatU64Map<MergeVal> merges;
  std::optional<std::string> unk_token_, prefix, suffix;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int32_t, 256> byte_ids{};
  uint64_t cache_id = g_next_cache_id.fetch_add(1);

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const MergeVal* merge(int32_t a, int32_t b) const { return merges.find(key(a, b)); }

  std::optional<int32_t> token_to_id(std::string_view t) const override { return vocab.find(t); }
  const std::string* id_to_token(int32_t id) const override { return vocab.token(id); }
  size_t vocab_size() const override { return vocab.size(); }
  int64_t end_id() const override { return vocab.end_id(); }
  std::optional<std::string> unk_token() const override { return unk_token_; }

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override {
    if (piece.empty()) return;
    if (ignore_merges) {
      if (auto id = vocab.find(piece)) {
        out.push_back(*id);
        return;
      }
    }
    if (piece.size() >= kCacheMaxLen) {
      merge_word(piece, out);
      return;
    }
    WordCache& cache = thread_cache(cache_id);
    if (const int32_t* e = cache.index.find(piece)) {
      const auto [off, n] = cache.entries[static_cast<size_t>(*e)];
      out.insert(out.end(), cache.ids.begin() + off, cache.ids.begin() + off + n);
      return;
    }
    const size_t before = out.size();
    merge_word(piece, out);
    if (cache.entries.size() < kCacheCapacity) {
      cache.index.insert(piece, static_cast<int32_t>(cache.entries.size()));
      cache.entries.emplace_back(static_cast<uint32_t>(cache.ids.size()), static_cast<uint32_t>(out.size() - before));
      cache.ids.insert(cache.ids.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
    }
  }

 private:
  struct Symbol {
    int32_t c;
    int32_t prev, next;
    uint32_t len;
  };

  int32_t unk_id() const {
    auto id = vocab.find(*unk_token_);
    MOE_CHECK(id.has_value(), "BPE: unk_token '{}' is not in the vocabulary", *unk_token_);
    return *id;
  }

  void merge_word(std::string_view w, std::vector<int32_t>& out) const {
    thread_local std::vector<Symbol> sym;
    thread_local QuadHeap heap;
    thread_local std::string buf;
    sym.clear();
    auto add = [&](int32_t c, uint32_t len) {
      const auto n = static_cast<int32_t>(sym.size());
      if (!sym.empty()) sym.back().next = n;
      sym.push_back({c, n - 1, -1, len});
    };
    int32_t unk = -1;
    uint32_t unk_len = 0;
    size_t i = 0;
    while (i < w.size()) {
      const size_t b = i;
      i += uni::seq_len(static_cast<unsigned char>(w[i]));
      const bool first = b == 0, last = i >= w.size();
      std::string_view s = w.substr(b, i - b);
      const auto byte_len = static_cast<uint32_t>(s.size());
      if ((!first && prefix) || (last && suffix)) {
        buf.clear();
        if (!first && prefix) buf += *prefix;
        buf += s;
        if (last && suffix) buf += *suffix;
        s = buf;
      }
      if (auto id = vocab.find(s)) {
        if (unk >= 0) {
          add(unk, unk_len);
          unk = -1;
        }
        add(*id, byte_len);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (char ch : s) all = all && byte_ids[static_cast<unsigned char>(ch)] >= 0;
        if (all) {
          for (char ch : s) add(byte_ids[static_cast<unsigned char>(ch)], 1);
          continue;
        }
      }
      if (unk_token_) {
        if (unk >= 0 && fuse_unk) {
          unk_len += byte_len;
        } else {
          if (unk >= 0) add(unk, unk_len);
          unk = unk_id();
          unk_len = byte_len;
        }
      }
    }
    if (unk >= 0) add(unk, unk_len);

    heap.clear();
    for (size_t k = 0; k + 1 < sym.size(); ++k)
      if (const MergeVal* m = merge(sym[k].c, sym[k + 1].c)) heap.push_unordered({cand_key(m->rank, k), m->new_id});
    heap.heapify();
    while (!heap.empty()) {
      const Cand top = heap.pop();
      const uint32_t pos = top.pos();
      Symbol& cur = sym[pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const Symbol right = sym[static_cast<size_t>(cur.next)];
      const MergeVal* m = merge(cur.c, right.c);
      if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
      sym[static_cast<size_t>(cur.next)].len = 0;
      cur.c = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(pos);
      if (cur.prev >= 0)
        if (const MergeVal* pm = merge(sym[static_cast<size_t>(cur.prev)].c, cur.c))
          heap.push({cand_key(pm->rank, static_cast<size_t>(cur.prev)), pm->new_id});
      if (cur.next >= 0)
        if (const MergeVal* nm = merge(cur.c, sym[static_cast<size_t>(cur.next)].c))
          heap.push({cand_key(nm->rank, pos), nm->new_id});
    }
    for (const Symbol& s : sym)
      if (s.len != 0) out.push_back(s.c);
  }
};

std::optional<std::string> opt_str(const json& j, const char* key, const std::string& where) {
  const json* v = js::find(j, key);
  if (!v || v->is_null()) return std::nullopt;
  MOE_CHECK(v->is_string(), "{}: field '{}' must be a string or null", where, key);
  return v->get<std::string>();
}

}  // namespace

std::unique_ptr<Model> make_bpe(const json& j, const std::string& where, ParsedVocab* side) {
  auto bpe = std::make_unique<BPE>();
  if (const json* d = js::find(j, "dropout"); d && !d->is_null()) {
    MOE_CHECK(d->is_number(), "{}: 'dropout' must be a number or null", where);
    const double p = d->get<double>();
    MOE_CHECK(p >= 0.0 && p <= 1.0, "{}: dropout {} is outside [0, 1]", where, p);
    // Dropout makes encoding random; 0 is the same as none.
    MOE_CHECK(p == 0.0, "{}: BPE dropout {} is not supported (only null or 0: encoding must be deterministic)", where,
              p);
  }
  bpe->unk_token_ = opt_str(j, "unk_token", where);
  bpe->prefix = opt_str(j, "continuing_subword_prefix", where);
  bpe->suffix = opt_str(j, "end_of_word_suffix", where);
  bpe->fuse_unk = js::boolean_or(j, "fuse_unk", false, where);
  bpe->byte_fallback = js::boolean_or(j, "byte_fallback", false, where);
  bpe->ignore_merges = js::boolean_or(j, "ignore_merges", false, where);
  bpe->vocab.build(read_vocab_map(j, side, where + ".vocab"), where + ".vocab");
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    bpe->byte_ids[b] = bpe->vocab.find(name).value_or(-1);
  }

  const json& merges = js::arr(j, "merges", where);
  const size_t prefix_len = bpe->prefix ? bpe->prefix->size() : 0;
  bpe->merges.reserve(merges.size());
  std::string a, b, joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    if (m.is_string()) {
      // "a b": exactly one space, as convert_merges_to_hashmap requires.
      const std::string& line = m.get_ref<const std::string&>();
      const size_t sp = line.find(' ');
      MOE_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos,
                "{}.merges[{}]: merge '{}' must be two tokens separated by one space", where, rank, line);
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else {
      MOE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                "{}.merges[{}]: a merge must be \"a b\" or [\"a\", \"b\"]", where, rank);
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const auto ia = bpe->vocab.find(a), ib = bpe->vocab.find(b);
    MOE_CHECK(ia.has_value(), "{}.merges[{}]: merge ('{}', '{}') names token '{}', which is not in the vocabulary",
              where, rank, a, b, a);
    MOE_CHECK(ib.has_value(), "{}.merges[{}]: merge ('{}', '{}') names token '{}', which is not in the vocabulary",
              where, rank, a, b, b);
    MOE_CHECK(b.size() >= prefix_len, "{}.merges[{}]: merge ('{}', '{}'): '{}' is shorter than the continuing "
              "subword prefix", where, rank, a, b, b);
    joined = a;
    joined.append(b, prefix_len, std::string::npos);
    const auto inew = bpe->vocab.find(joined);
    MOE_CHECK(inew.has_value(),
              "{}.merges[{}]: merge ('{}', '{}') makes '{}', which is not in the vocabulary", where, rank, a, b,
              joined);
    // A repeated pair keeps its last rank, as collecting into the Rust HashMap does.
    bpe->merges.insert(BPE::key(*ia, *ib), {static_cast<uint32_t>(rank), *inew});
  }
  return bpe;
}

std::unique_ptr<Model> make_model(const json& j, const std::string& where, ParsedVocab* side) {
  MOE_CHECK(j.is_object(), "{}: 'model' must be an object", where);
  std::string type;
  if (const json* t = js::find(j, "type"); t && !t->is_null()) {
    MOE_CHECK(t->is_string(), "{}: field 'type' must be a string", where);
    type = t->get<std::string>();
  } else {
    // Files from before "type" existed: tell the models apart by their fields.
    if (js::find(j, "merges"))
      type = "BPE";
    else if (js::find(j, "continuing_subword_prefix") || js::find(j, "max_input_chars_per_word"))
      type = "WordPiece";
    else if (const json* v = js::find(j, "vocab"); v && v->is_array() && !(side && side->collected))
      type = "Unigram";
    else
      type = "WordLevel";
  }
  if (type == "BPE") return make_bpe(j, where, side);
  if (type == "WordPiece") return make_wordpiece(j, where, side);
  if (type == "WordLevel") return make_wordlevel(j, where, side);
  if (type == "Unigram") return make_unigram(j, where);
  MOE_FAIL("{}: unsupported model type '{}' (supported: BPE, WordPiece, WordLevel, Unigram)", where, type);
}

}  // namespace moe::text
