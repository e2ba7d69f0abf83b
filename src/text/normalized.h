// A piece of text being normalised and pre-tokenised, as `tokenizers`' NormalizedString.
//
// Only one thing downstream reads the alignment to the original text: Metaspace with
// prepend_scheme "first" prepends "▁" only to a piece whose original offset is 0. So the
// alignment is tracked (per normalised byte: the start of the original byte range it
// came from, relative to this piece, updated the way NormalizedString::transform_range
// updates it) only when a tokenizer needs it; otherwise these are plain string edits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/regex.h"
#include "text/unicode.h"

namespace moe::text {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class NormalizedString {
 public:
  NormalizedString() = default;
  NormalizedString(std::string s, bool track);

  const std::string& get() const { return s_; }
  bool empty() const { return s_.empty(); }
  bool tracking() const { return track_; }
  // offsets_original().0: where this piece starts in the text given to encode (only
  // meaningful when tracking).
  size_t original_start() const { return shift_; }

  // (char, change) edits as NormalizedString::transform: change 0 replaces a char, 1 adds
  // one, -n replaces one and removes the n after it; `initial_offset` chars are dropped
  // at the start. Applies to the whole string.
  using Edit = std::pair<char32_t, int>;
  void transform(const std::vector<Edit>& dest, size_t initial_offset);

  void prepend(std::string_view p);
  void append(std::string_view p);
  void replace(const Pattern& pat, std::string_view content);
  void replace_char(char32_t from, std::string_view to);  // every `from` -> `to`
  void lstrip();
  void rstrip();
  void lowercase();
  void normalize(uni::NormForm form);
  // Keeps the chars for which keep(c) holds (NormalizedString::filter).
  template <class F>
  void filter(F keep);
  // Replaces each char by map(c) (NormalizedString::map).
  template <class F>
  void map(F fn);
  // Each byte b -> the GPT-2 ByteLevel char of b.
  void byte_level();

  NormalizedString slice(size_t start, size_t end) const;
  // NormalizedString::split over pattern pieces (see Pattern::find_matches); empty
  // results are dropped, as PreTokenizedString::split does.
  void split(const std::vector<Pattern::Piece>& matches, SplitBehavior behavior,
             std::vector<NormalizedString>& out) const;

 private:
  void set(std::string s, std::vector<uint32_t> align) {
    s_ = std::move(s);
    align_ = std::move(align);
  }
  std::string s_;
  std::vector<uint32_t> align_;  // per byte of s_, when track_
  size_t shift_ = 0;
  bool track_ = false;
};

template <class F>
void NormalizedString::filter(F keep) {
  if (!track_) {
    std::string out;
    out.reserve(s_.size());
    size_t i = 0;
    while (i < s_.size()) {
      const size_t b = i;
      const char32_t c = uni::next_cp(s_, i);
      if (keep(c)) out.append(s_, b, i - b);
    }
    s_ = std::move(out);
    return;
  }
  // Same edit list as NormalizedString::filter: each kept char carries the count of
  // removed chars that follow it; removed chars before the first kept one are the
  // initial offset.
  std::vector<Edit> edits;
  int removed = 0;
  size_t removed_start = 0;
  bool have_last = false;
  char32_t last = 0;
  size_t i = 0;
  while (i < s_.size()) {
    const char32_t c = uni::next_cp(s_, i);
    if (keep(c)) {
      if (have_last)
        edits.emplace_back(last, -removed);
      else
        removed_start = static_cast<size_t>(removed);
      last = c;
      have_last = true;
      removed = 0;
    } else {
      ++removed;
    }
  }
  if (have_last) edits.emplace_back(last, -removed);
  else removed_start = static_cast<size_t>(removed);
  transform(edits, removed_start);
}

template <class F>
void NormalizedString::map(F fn) {
  std::string out;
  out.reserve(s_.size());
  std::vector<uint32_t> align;
  size_t i = 0;
  while (i < s_.size()) {
    const size_t b = i;
    const char32_t c = fn(uni::next_cp(s_, i));
    const size_t before = out.size();
    uni::append_utf8(out, c);
    if (track_) align.insert(align.end(), out.size() - before, align_[b]);
  }
  set(std::move(out), std::move(align));
}

}  // namespace moe::text
