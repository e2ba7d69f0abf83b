// See added_vocab.h. find_matches follows AddedVocabulary::find_matches line by line:
// matches come from the leftmost-longest automaton over all tokens of the set; a match
// of a skipped special token (parse_special false) or of a single_word token that is not
// a whole word is dropped (and still consumed, as the automaton moved past it); lstrip
// extends the match back over whitespace but never before the previous match's end;
// rstrip extends it forward.
#include "text/added_vocab.h"

#include <algorithm>
#include <tuple>

#include "text/unicode.h"

namespace moe::text {

void AddedVocabulary::Matcher::add(std::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  int32_t n = 0;
  for (unsigned char ch : pattern) {
    auto it = nodes[n].kids.find(ch);
    if (it == nodes[n].kids.end()) {
      nodes.emplace_back();
      const auto nn = static_cast<int32_t>(nodes.size() - 1);
      nodes[n].kids.emplace(ch, nn);
      n = nn;
    } else {
      n = it->second;
    }
  }
  nodes[n].value = id;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  empty = false;
}

void AddedVocabulary::Matcher::find(std::string_view s, std::vector<std::tuple<size_t, size_t, int32_t>>& out) const {
  out.clear();
  if (empty) return;
  size_t i = 0;
  while (i < s.size()) {
    if (!first_byte[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    int32_t n = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < s.size(); ++k) {
      auto it = nodes[n].kids.find(static_cast<unsigned char>(s[k]));
      if (it == nodes[n].kids.end()) break;
      n = it->second;
      if (nodes[n].value >= 0) {
        best = nodes[n].value;
        best_end = k + 1;
      }
    }
    if (best >= 0) {
      out.emplace_back(i, best_end, best);
      i = best_end;
    } else {
      ++i;
    }
  }
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = map_.find(content);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::token(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

const std::string* AddedVocabulary::id_to_token(int32_t id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  auto n = normalized_.find(id);
  return n != normalized_.end() ? &n->second : &it->second.content;
}

void AddedVocabulary::add_tokens(const std::vector<AddedToken>& tokens, const Model& model, const Normalizer* norm) {
  const auto vsize = static_cast<int64_t>(model.vocab_size());
  int64_t next_id = max_id_ < 0 ? vsize : (max_id_ >= vsize || vsize == 0 ? max_id_ + 1 : vsize);
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    if (auto id = token_to_id(t.content)) {
      auto it = by_id_.find(*id);
      if (it != by_id_.end() && it->second == t) continue;
    }
    int64_t id;
    if (auto a = token_to_id(t.content))
      id = *a;
    else if (auto m = model.token_to_id(t.content))
      id = *m;
    else
      id = next_id++;
    MOE_CHECK(id < (int64_t{1} << 31), "added token '{}' would get id {}, past 2^31", t.content, id);
    const auto id32 = static_cast<int32_t>(id);
    if (t.normalized && norm) {
      NormalizedString s(t.content, false);
      norm->normalize(s);
      if (s.get() != t.content) normalized_[id32] = s.get();
    }
    map_[t.content] = id32;
    if (t.special) special_.insert(t.content);
    by_id_[id32] = t;
    max_id_ = std::max<int64_t>(max_id_, id);
  }
  refresh();
}

void AddedVocabulary::refresh() {
  raw_ = Matcher{};
  norm_ = Matcher{};
  // Insert in id order so that the result does not depend on hash order.
  std::vector<int32_t> ids;
  ids.reserve(by_id_.size());
  for (const auto& [id, t] : by_id_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int32_t id : ids) {
    const AddedToken& t = by_id_.at(id);
    if (t.normalized) {
      auto n = normalized_.find(id);
      norm_.add(n != normalized_.end() ? n->second : t.content, id);
    } else {
      raw_.add(t.content, id);
    }
  }
}

namespace {

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = uni::prev_start(s, s.size());
  return uni::is_word_char(uni::next_cp(s, i));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return uni::is_word_char(uni::next_cp(s, i));
}

// Start of the trailing whitespace run (regex \s*$).
size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t b = uni::prev_start(s, end), j = b;
    if (!uni::is_whitespace(uni::next_cp(s, j))) break;
    end = b;
  }
  return end;
}

// Length of the leading whitespace run (regex ^\s*).
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!uni::is_whitespace(uni::next_cp(s, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

void AddedVocabulary::find_matches(std::string_view s, const Matcher& m, bool parse_special,
                                   std::vector<std::tuple<int32_t, size_t, size_t>>& out) const {
  out.clear();
  if (s.empty()) {
    out.emplace_back(-1, 0, 0);
    return;
  }
  thread_local std::vector<std::tuple<size_t, size_t, int32_t>> found;
  m.find(s, found);
  size_t start_offset = 0;
  for (auto [start, stop, id] : found) {
    const AddedToken& t = by_id_.at(id);
    if (!parse_special && special_.count(t.content)) continue;
    if (t.single_word) {
      const bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
      const bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(space_leftmost_at_end(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += space_rightmost_at_start(s.substr(stop));
    if (start_offset < start) out.emplace_back(-1, start_offset, start);
    out.emplace_back(id, start, stop);
    start_offset = stop;
  }
  if (start_offset != s.size()) out.emplace_back(-1, start_offset, s.size());
}

void AddedVocabulary::extract_and_normalize(std::string_view text, const Normalizer* norm, bool parse_special,
                                            bool track, Splits& out) const {
  out.clear();
  NormalizedString whole{std::string(text), track};
  thread_local std::vector<std::tuple<int32_t, size_t, size_t>> pieces;
  find_matches(whole.get(), raw_, parse_special, pieces);
  Splits first;
  if (pieces.size() == 1 && std::get<0>(pieces[0]) < 0) {
    if (!whole.empty()) first.push_back({std::move(whole), -1});
  } else {
    for (auto [id, s, e] : pieces) {
      // A piece can end before it starts when an rstrip-extended match overlaps the next
      // match (tokenizers slices nothing there either).
      if (e <= s) continue;
      first.push_back({whole.slice(s, e), id});
    }
  }
  for (auto& sp : first) {
    if (sp.id >= 0) {
      out.push_back(std::move(sp));
      continue;
    }
    if (norm) norm->normalize(sp.text);
    if (sp.text.empty()) continue;
    find_matches(sp.text.get(), norm_, parse_special, pieces);
    // tokenizers slices even a piece without matches, which moves its original offset to
    // where its first normalised byte came from (e.g. past spaces a Strip removed); that
    // offset is only read when tracking.
    if (pieces.size() == 1 && std::get<0>(pieces[0]) < 0 && !track) {
      out.push_back(std::move(sp));
      continue;
    }
    for (auto [id, s, e] : pieces) {
      if (e <= s) continue;
      out.push_back({sp.text.slice(s, e), id});
    }
  }
}

}  // namespace moe::text
