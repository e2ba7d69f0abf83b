// Small text scans the streaming parsers share: markers that may be cut between two
// pieces of streamed text, whitespace runs, and where a JSON value ends.
#pragma once

#include <cstddef>
#include <string_view>

namespace moe::serve::parsers {

// JSON's whitespace, which is also what models put between tags.
inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

inline size_t skip_ws(std::string_view s, size_t i = 0) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

inline std::string_view trim_ws(std::string_view s) {
  size_t b = skip_ws(s), e = s.size();
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`: that
// many bytes must wait for the next piece, which may complete the marker ("</th" + "ink>").
inline size_t partial_marker_len(std::string_view text, std::string_view marker) {
  const size_t most = std::min(text.size(), marker.size() - 1);
  for (size_t n = most; n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Where the JSON object or array starting at s[i] ('{' or '['), ends: the index just
// past its closing bracket. Strings (and their escapes) are skipped, so brackets inside
// them do not count. Only the nesting is checked; the JSON parser checks the rest.
struct JsonExtent {
  enum Status { incomplete, complete, invalid } status = incomplete;
  size_t end = 0;
};
// Calls on_bracket(c, pos) for each bracket ({, [, }, ]) of s from index i on that is
// outside a JSON string (escapes handled), until it returns false; returns the index it
// stopped at (s.size() when it never did). The one string-skipping scan of JSON text
// that json_extent and the request parser's nesting check (openai.cpp) share.
template <class OnBracket>
size_t scan_json_brackets(std::string_view s, size_t i, OnBracket on_bracket) {
  bool in_string = false, escaped = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '{' || c == '[' || c == '}' || c == ']') && !on_bracket(c, i)) {
      return i;
    }
  }
  return s.size();
}

inline JsonExtent json_extent(std::string_view s, size_t i) {
  int depth = 0;
  JsonExtent out;
  scan_json_brackets(s, i, [&](char c, size_t pos) {
    if (c == '{' || c == '[') return ++depth, true;
    if (--depth < 0) out = {JsonExtent::invalid, pos};
    else if (depth == 0) out = {JsonExtent::complete, pos + 1};
    return depth > 0;
  });
  if (out.status == JsonExtent::incomplete) out.end = s.size();
  return out;
}

}  // namespace moe::serve::parsers
