// See normalized.h. The alignment rules follow NormalizedString::transform_range: a
// replacing char keeps the alignment of the char it replaces, an added char copies the
// alignment of the byte before it (0 at the very start), and a slice's original start is
// the alignment of its first byte.
#include "text/normalized.h"

#include <algorithm>

namespace moe::text {

NormalizedString::NormalizedString(std::string s, bool track) : s_(std::move(s)), track_(track) {
  if (track_) {
    align_.resize(s_.size());
    for (size_t i = 0; i < s_.size(); ++i) align_[i] = static_cast<uint32_t>(i);
  }
}

void NormalizedString::transform(const std::vector<Edit>& dest, size_t initial_offset) {
  std::string out;
  out.reserve(s_.size());
  if (!track_) {
    for (const auto& e : dest) uni::append_utf8(out, e.first);
    s_ = std::move(out);
    return;
  }
  std::vector<uint32_t> align;
  align.reserve(s_.size());
  size_t off = 0;
  for (size_t k = 0; k < initial_offset && off < s_.size(); ++k) off += uni::seq_len(static_cast<unsigned char>(s_[off]));
  auto at = [&](size_t idx) -> uint32_t {
    if (align_.empty()) return 0;
    return align_[std::min(idx, align_.size() - 1)];
  };
  for (const auto& [c, change] : dest) {
    const uint32_t a = change > 0 ? (off < 1 ? 0 : at(off - 1)) : at(off);
    if (change <= 0 && off < s_.size()) off += uni::seq_len(static_cast<unsigned char>(s_[off]));
    for (int r = 0; r < -change && off < s_.size(); ++r) off += uni::seq_len(static_cast<unsigned char>(s_[off]));
    const size_t before = out.size();
    uni::append_utf8(out, c);
    align.insert(align.end(), out.size() - before, a);
  }
  set(std::move(out), std::move(align));
}

void NormalizedString::prepend(std::string_view p) {
  if (s_.empty() || p.empty()) return;
  if (track_) align_.insert(align_.begin(), p.size(), align_[0]);
  s_.insert(0, p);
}

void NormalizedString::append(std::string_view p) {
  if (p.empty()) return;
  if (track_) align_.insert(align_.end(), p.size(), align_.empty() ? 0 : align_.back());
  s_.append(p);
}

void NormalizedString::replace(const Pattern& pat, std::string_view content) {
  thread_local std::vector<std::pair<size_t, size_t>> m;
  pat.find_all(s_, m);
  if (m.empty()) return;
  std::string out;
  out.reserve(s_.size() + content.size() * m.size());
  std::vector<uint32_t> align;
  size_t last = 0;
  for (auto [s, e] : m) {
    out.append(s_, last, s - last);
    if (track_) {
      align.insert(align.end(), align_.begin() + static_cast<ptrdiff_t>(last), align_.begin() + static_cast<ptrdiff_t>(s));
      align.insert(align.end(), content.size(), e >= 1 ? align_[e - 1] : 0);
    }
    out.append(content);
    last = e;
  }
  out.append(s_, last, std::string::npos);
  if (track_) align.insert(align.end(), align_.begin() + static_cast<ptrdiff_t>(last), align_.end());
  set(std::move(out), std::move(align));
}

void NormalizedString::replace_char(char32_t from, std::string_view to) {
  const std::string f = uni::to_utf8(from);
  if (s_.find(f) == std::string::npos) return;
  replace(Pattern::literal(f), to);
}

void NormalizedString::lstrip() {
  size_t i = 0;
  while (i < s_.size()) {
    size_t j = i;
    if (!uni::is_whitespace(uni::next_cp(s_, j))) break;
    i = j;
  }
  if (i == 0) return;
  s_.erase(0, i);
  if (track_) align_.erase(align_.begin(), align_.begin() + static_cast<ptrdiff_t>(i));
}

void NormalizedString::rstrip() {
  size_t end = s_.size();
  while (end > 0) {
    size_t b = uni::prev_start(s_, end), j = b;
    if (!uni::is_whitespace(uni::next_cp(s_, j))) break;
    end = b;
  }
  if (end == s_.size()) return;
  s_.resize(end);
  if (track_) align_.resize(end);
}

void NormalizedString::lowercase() {
  // ASCII fast path (no change in length, alignment unchanged).
  bool ascii = true;
  for (char ch : s_)
    if (static_cast<unsigned char>(ch) >= 0x80) {
      ascii = false;
      break;
    }
  if (ascii) {
    for (char& ch : s_)
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
    return;
  }
  std::vector<Edit> edits;
  edits.reserve(s_.size());
  std::u32string low;
  size_t i = 0;
  while (i < s_.size()) {
    low.clear();
    uni::append_lowercase(low, uni::next_cp(s_, i));
    for (size_t k = 0; k < low.size(); ++k) edits.emplace_back(low[k], k > 0 ? 1 : 0);
  }
  transform(edits, 0);
}

void NormalizedString::normalize(uni::NormForm form) {
  if (uni::is_normalized_quick(s_, form)) return;
  std::string whole = uni::normalize(s_, form);
  if (whole == s_) return;
  if (!track_) {
    s_ = std::move(whole);
    return;
  }
  // Alignment: normalise runs of (starter + following non-starters); when a run's output
  // has as many chars as its input they map one to one, otherwise every output char takes
  // the run's first alignment (what unicode-normalization-alignments yields for
  // decompositions and compositions). Runs that compose across their boundary (Hangul
  // jamo, some Indic vowel signs) are merged first so each run normalises on its own.
  std::vector<std::pair<size_t, size_t>> runs;  // byte ranges
  size_t i = 0;
  while (i < s_.size()) {
    const size_t b = i;
    const char32_t c = uni::next_cp(s_, i);
    if (runs.empty() || uni::combining_class(c) == 0)
      runs.emplace_back(b, i);
    else
      runs.back().second = i;
  }
  std::vector<std::pair<size_t, size_t>> merged;
  for (const auto& r : runs) {
    if (!merged.empty()) {
      const std::string_view sv(s_);
      const auto& p = merged.back();
      const std::string both = uni::normalize(sv.substr(p.first, r.second - p.first), form);
      const std::string apart = uni::normalize(sv.substr(p.first, p.second - p.first), form) +
                                uni::normalize(sv.substr(r.first, r.second - r.first), form);
      if (both != apart) {
        merged.back().second = r.second;
        continue;
      }
    }
    merged.push_back(r);
  }
  std::string out;
  std::vector<uint32_t> align;
  for (const auto& [b, e] : merged) {
    const std::string_view in(s_.data() + b, e - b);
    const std::string n = uni::normalize(in, form);
    size_t nin = 0, nout = 0;
    for (size_t k = 0; k < in.size(); uni::next_cp(in, k)) ++nin;
    for (size_t k = 0; k < n.size(); uni::next_cp(n, k)) ++nout;
    size_t ki = 0, ko = 0;
    while (ko < n.size()) {
      const size_t ob = ko;
      uni::next_cp(n, ko);
      const uint32_t a = nin == nout ? align_[b + ki] : align_[b];
      if (nin == nout) uni::next_cp(in, ki);
      align.insert(align.end(), ko - ob, a);
    }
    out += n;
  }
  set(std::move(out), std::move(align));
}

void NormalizedString::byte_level() {
  std::string out;
  out.reserve(s_.size() * 2);
  for (char ch : s_) out += uni::byte_to_utf8(static_cast<uint8_t>(ch));
  if (track_) {
    std::vector<uint32_t> align;
    align.reserve(out.size());
    for (size_t i = 0; i < s_.size(); ++i)
      align.insert(align.end(), uni::byte_to_utf8(static_cast<uint8_t>(s_[i])).size(), align_[i]);
    align_ = std::move(align);
  }
  s_ = std::move(out);
}

NormalizedString NormalizedString::slice(size_t start, size_t end) const {
  NormalizedString r;
  r.track_ = track_;
  r.s_.assign(s_, start, end - start);
  if (track_) {
    // An empty slice keeps the start offset in normalised units, as convert_offsets
    // returns the empty target range unchanged.
    const uint32_t base = start < end ? align_[start] : static_cast<uint32_t>(start);
    r.shift_ = shift_ + base;
    r.align_.resize(end - start);
    for (size_t k = start; k < end; ++k) r.align_[k - start] = align_[k] >= base ? align_[k] - base : 0;
  }
  return r;
}

void NormalizedString::split(const std::vector<Pattern::Piece>& matches, SplitBehavior behavior,
                             std::vector<NormalizedString>& out) const {
  // (start, end, remove) after applying the behaviour, as NormalizedString::split.
  thread_local std::vector<Pattern::Piece> splits;
  splits.clear();
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const auto& m : matches) splits.push_back({m.start, m.end, false});
      break;
    case SplitBehavior::Removed:
      splits = matches;
      break;
    case SplitBehavior::Contiguous: {
      bool prev = false;
      for (const auto& m : matches) {
        if (m.match == prev && !splits.empty())
          splits.back().end = m.end;
        else
          splits.push_back({m.start, m.end, false});
        prev = m.match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool prev = false;
      for (const auto& m : matches) {
        if (m.match && !prev && !splits.empty())
          splits.back().end = m.end;
        else
          splits.push_back({m.start, m.end, false});
        prev = m.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = matches.size(); k-- > 0;) {
        const auto& m = matches[k];
        if (m.match && !prev && !splits.empty())
          splits.back().start = m.start;
        else
          splits.push_back({m.start, m.end, false});
        prev = m.match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  for (const auto& p : splits) {
    if (p.match || p.start == p.end) continue;  // `match` here means "remove"
    out.push_back(slice(p.start, p.end));
  }
}

}  // namespace moe::text
