// The Unigram model of `tokenizers` (src/models/unigram/model.rs, encode_optimized): a
// Viterbi pass over the pieces found by common-prefix search from each character, an
// unknown character costing min_score - 10; consecutive unknowns are fused into one
// string, which then becomes <0xNN> byte tokens (byte_fallback) or unk_id. Ties keep the
// first candidate (shorter pieces are tried first), as the Rust code does.
#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <map>

#include "text/model.h"
#include "text/unicode.h"

namespace moe::text {

namespace {

using js::json;

// A byte trie in flat arrays: node k's children are edges[first[k] .. first[k+1]).
class Trie {
 public:
  void build(const std::vector<std::string>& keys, const std::vector<int32_t>& values) {
    struct Tmp {
      std::map<unsigned char, int32_t> kids;
      int32_t value = -1;
    };
    std::vector<Tmp> t(1);
    for (size_t k = 0; k < keys.size(); ++k) {
      int32_t n = 0;
      for (unsigned char ch : keys[k]) {
        auto it = t[n].kids.find(ch);
        if (it == t[n].kids.end()) {
          t.emplace_back();
          const auto nn = static_cast<int32_t>(t.size() - 1);
          t[n].kids.emplace(ch, nn);
          n = nn;
        } else {
          n = it->second;
        }
      }
      t[n].value = values[k];
    }
    first_.assign(t.size() + 1, 0);
    value_.resize(t.size());
    for (size_t n = 0; n < t.size(); ++n) {
      first_[n + 1] = first_[n] + static_cast<int32_t>(t[n].kids.size());
      value_[n] = t[n].value;
      for (auto [ch, kid] : t[n].kids) edges_.push_back({ch, kid});
    }
  }
  // Calls f(length, value) for every key that is a prefix of s, shortest first.
  template <class F>
  void common_prefixes(std::string_view s, F f) const {
    int32_t n = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const auto ch = static_cast<unsigned char>(s[i]);
      int32_t lo = first_[n], hi = first_[n + 1], next = -1;
      while (lo < hi) {
        const int32_t mid = (lo + hi) / 2;
        if (edges_[mid].ch < ch)
          lo = mid + 1;
        else if (edges_[mid].ch > ch)
          hi = mid;
        else {
          next = edges_[mid].kid;
          break;
        }
      }
      if (next < 0) return;
      n = next;
      if (value_[n] >= 0) f(i + 1, value_[n]);
    }
  }

 private:
  struct Edge {
    unsigned char ch;
    int32_t kid;
  };
  std::vector<int32_t> first_, value_;
  std::vector<Edge> edges_;
};

class Unigram final : public Model {
 public:
  std::vector<std::string> pieces;
  std::vector<double> scores;
  FlatStrMap ids;  // token -> id; a repeated piece keeps its last id
  Trie trie;
  std::optional<int32_t> unk_id;
  bool byte_fallback = false;
  double min_score = std::numeric_limits<double>::infinity();
  std::array<int32_t, 256> byte_ids{};

  std::optional<int32_t> token_to_id(std::string_view t) const override {
    const int32_t* v = ids.find(t);
    if (!v) return std::nullopt;
    return *v;
  }
  const std::string* id_to_token(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < pieces.size() ? &pieces[id] : nullptr;
  }
  size_t vocab_size() const override { return pieces.size(); }
  int64_t end_id() const override { return static_cast<int64_t>(pieces.size()); }
  std::optional<std::string> unk_token() const override {
    if (!unk_id) return std::nullopt;
    return pieces[static_cast<size_t>(*unk_id)];
  }

  void tokenize(std::string_view s, std::vector<int32_t>& out) const override {
    if (s.empty()) return;
    struct Node {
      int32_t id = 0;
      double score = 0.0;
      int64_t start = -1;
    };
    const size_t n = s.size();
    std::vector<Node> best(n + 1);
    const double unk_score = min_score - 10.0;
    size_t pos = 0;
    while (pos < n) {
      const double here = best[pos].score;
      const size_t mblen = uni::seq_len(static_cast<unsigned char>(s[pos]));
      bool single = false;
      trie.common_prefixes(s.substr(pos), [&](size_t len, int32_t id) {
        Node& t = best[pos + len];
        const double cand = scores[static_cast<size_t>(id)] + here;
        if (t.start < 0 || cand > t.score) {
          t.score = cand;
          t.start = static_cast<int64_t>(pos);
          t.id = id;
        }
        if (len == mblen) single = true;
      });
      if (!single) {
        Node& t = best[pos + mblen];
        const double cand = unk_score + here;
        if (t.start < 0 || cand > t.score) {
          MOE_CHECK(unk_id.has_value(), "Unigram: '{}' has a character not in the vocabulary and the model has no "
                    "unk_id", s);
          t.score = cand;
          t.start = static_cast<int64_t>(pos);
          t.id = *unk_id;
        }
      }
      pos += mblen;
    }
    // Back-track, fusing runs of unk into one string.
    std::vector<std::pair<size_t, size_t>> parts;  // byte ranges, reversed
    size_t end = n, unk_end = 0;
    bool in_unk = false;
    while (end > 0) {
      const Node& node = best[end];
      const auto start = static_cast<size_t>(node.start);
      if (unk_id && node.id == *unk_id) {
        if (!in_unk) unk_end = end;
        in_unk = true;
      } else {
        if (in_unk) parts.emplace_back(end, unk_end);
        in_unk = false;
        parts.emplace_back(start, end);
      }
      end = start;
    }
    if (in_unk) parts.emplace_back(0, unk_end);
    for (size_t k = parts.size(); k-- > 0;) {
      const std::string_view str = s.substr(parts[k].first, parts[k].second - parts[k].first);
      if (auto id = token_to_id(str)) {
        out.push_back(*id);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (char ch : str) all = all && byte_ids[static_cast<unsigned char>(ch)] >= 0;
        if (all) {
          for (char ch : str) out.push_back(byte_ids[static_cast<unsigned char>(ch)]);
          continue;
        }
      }
      MOE_CHECK(unk_id.has_value(), "Unigram: '{}' is not in the vocabulary and the model has no unk_id", str);
      out.push_back(*unk_id);
    }
  }
};

}  // namespace

std::unique_ptr<Model> make_unigram(const json& j, const std::string& where) {
  auto m = std::make_unique<Unigram>();
  const json& vocab = js::arr(j, "vocab", where);
  MOE_CHECK(vocab.size() <= kMaxVocabEntries, "{}: vocabulary has {} entries, more than the supported {}", where,
            vocab.size(), kMaxVocabEntries);
  m->pieces.reserve(vocab.size());
  m->ids.reserve(vocab.size());
  m->scores.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& e = vocab[i];
    MOE_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
              "{}.vocab[{}]: expected [\"piece\", score]", where, i);
    m->pieces.push_back(e[0].get<std::string>());
    m->scores.push_back(e[1].get<double>());
    m->min_score = std::min(m->min_score, m->scores.back());
    m->ids.insert(m->pieces.back(), static_cast<int32_t>(i));
  }
  if (const json* u = js::find(j, "unk_id"); u && !u->is_null()) {
    MOE_CHECK(u->is_number_integer(), "{}: 'unk_id' must be an integer or null", where);
    const int64_t id = u->get<int64_t>();
    MOE_CHECK(!m->pieces.empty(), "{}: the vocabulary is empty but at least <unk> is needed", where);
    MOE_CHECK(id >= 0 && id < static_cast<int64_t>(m->pieces.size()), "{}: unk_id {} is outside the vocabulary (size {})",
              where, id, m->pieces.size());
    m->unk_id = static_cast<int32_t>(id);
  }
  m->byte_fallback = js::boolean_or(j, "byte_fallback", false, where);
  std::vector<int32_t> values(m->pieces.size());
  for (size_t i = 0; i < m->pieces.size(); ++i) values[i] = *m->ids.find(m->pieces[i]);
  m->trie.build(m->pieces, values);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_ids[b] = m->token_to_id(name).value_or(-1);
  }
  return m;
}

}  // namespace moe::text
