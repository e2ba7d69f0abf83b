// UTF-8 and Python str primitives for the Jinja interpreter: decoding (invalid bytes
// become U+FFFD instead of failing), str.isspace, strip, and case mapping (utf8proc's
// simple mappings, with ASCII fast paths).
#include <utf8proc.h>

#include <algorithm>

#include "text/jinja_value.h"

namespace moe::jinja::detail {

// ---- UTF-8 -------------------------------------------------------------------------------------------

bool is_ascii(std::string_view s) {
  for (unsigned char ch : s)
    if (ch >= 0x80) return false;
  return true;
}

namespace {
// Decodes one code point at s[i]; returns its length, or 0 when the bytes are not valid.
size_t decode_one(std::string_view s, size_t i, char32_t& cp) {
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  size_t n;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) { n = 2; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { n = 3; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { n = 4; cp = b0 & 0x07; min = 0x10000; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    unsigned char b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}
}  // namespace

bool validate_utf8(std::string_view s, size_t* bad_offset) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    size_t n = decode_one(s, i, cp);
    if (!n) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += n;
  }
  return true;
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    size_t n = decode_one(s, i, cp);
    if (!n) {
      out += U'\uFFFD';
      ++i;
    } else {
      out += cp;
      i += n;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogates have no UTF-8 form
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t cp_len(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode(s).size();
}

bool py_isspace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  if (is_ascii(s) && (!chars || is_ascii(*chars))) {
    bool table[128] = {};
    if (chars) {
      for (unsigned char ch : *chars) table[ch] = true;
    } else {
      for (int ch = 0; ch < 128; ++ch) table[ch] = py_isspace(static_cast<char32_t>(ch));
    }
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && table[static_cast<unsigned char>(s[b])]) ++b;
    if (right)
      while (e > b && table[static_cast<unsigned char>(s[e - 1])]) --e;
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = decode(s);
  std::u32string set;
  if (chars) set = decode(*chars);
  std::sort(set.begin(), set.end());  // binary search: a long `chars` stays cheap
  auto strip_me = [&](char32_t c) {
    return chars ? std::binary_search(set.begin(), set.end(), c) : py_isspace(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_me(u[b])) ++b;
  if (right)
    while (e > b && strip_me(u[e - 1])) --e;
  if (is_ascii(s)) return std::string(s.substr(b, e - b));
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::string py_upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& ch : out)
      if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 32);
    return out;
  }
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s)) {
    if (c == U'\u00DF') {
      out += "SS";  // the one full (non 1:1) case mapping templates might meet
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

std::string py_lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& ch : out)
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
    return out;
  }
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s))
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  return out;
}

}  // namespace moe::jinja::detail
