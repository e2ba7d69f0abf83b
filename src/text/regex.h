// Oniguruma regexes exactly as `tokenizers` runs them (its SysRegex: the `onig` crate,
// default syntax, UTF-8, ONIG_OPTION_NONE), with the `onig` crate's find_iter semantics
// for successive non-overlapping matches, including how it steps over empty matches.
//
// A compiled Regex is immutable; find_all may run on several threads at once (each call
// uses its own OnigRegion).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moe::text {

class Regex {
 public:
  // Throws moe::Error with Oniguruma's message when `pattern` does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [start, end) of every match, as onig::Regex::find_iter yields them.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* re_ = nullptr;  // OnigRegex
};

// A split pattern: a literal string or a regex, as `tokenizers`' String / Regex patterns.
// find_matches covers the whole text with (range, is_match) pieces like Pattern::find_matches.
class Pattern {
 public:
  static Pattern literal(std::string s);
  static Pattern regex(const std::string& re);
  // (start, end, is_match) pieces covering text; empty text gives one empty non-match.
  struct Piece {
    size_t start, end;
    bool match;
  };
  void find_matches(std::string_view text, std::vector<Piece>& out) const;
  // Plain match ranges.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string literal_;
  std::shared_ptr<Regex> regex_;
};

}  // namespace moe::text
