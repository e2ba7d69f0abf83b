// See unicode.h. Character properties come from utf8proc (Unicode 15); Rust's tables may
// be a version newer, which only matters for code points assigned since.
#include "text/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace moe::text::uni {

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 with `bad` = bytes of the maximal
// invalid subpart (>= 1), as the Unicode "maximal subpart" rule (and Rust) define it.
size_t valid_seq(std::string_view s, size_t i, size_t& bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      bad = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      bad = k;
      return 0;
    }
  }
  return need + 1;
}

struct ByteTable {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // every mapped code point is < 324
  std::array<std::string, 256> utf8;
  ByteTable() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    for (int b = 0; b < 256; ++b) {
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
      append_utf8(utf8[b], to_cp[b]);
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}


}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Fast path over ASCII.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    const size_t n = valid_seq(s, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string to_utf8(char32_t c) {
  std::string s;
  append_utf8(s, c);
  return s;
}

std::string from_utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = 0;
    const size_t n = valid_seq(s, i, bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace tables {
struct Range {
  char32_t lo, hi;
};
#include "text/unicode_tables.inc"
}  // namespace tables

namespace {

template <size_t N>
bool in(const tables::Range (&r)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (r[mid].hi < c)
      lo = mid + 1;
    else if (r[mid].lo > c)
      hi = mid;
    else
      return true;
  }
  return false;
}

}  // namespace

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in(tables::kNumeric, c);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                       (c >= 0x7B && c <= 0x7E);
  return in(tables::kPunct, c);
}

bool is_bert_control(char32_t c) { return in(tables::kBertControl, c); }

bool is_mark_nonspacing(char32_t c) { return c >= 0x300 && in(tables::kMn, c); }

bool is_mark(char32_t c) { return c >= 0x300 && in(tables::kCombining, c); }

bool is_word_char(char32_t c) {
  if (c < 0x80) return c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9');
  return in(tables::kWord, c);
}

void append_lowercase(std::u32string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  const tables::Lower* lo = std::begin(tables::kLower);
  const tables::Lower* hi = std::end(tables::kLower);
  const tables::Lower* it = std::lower_bound(lo, hi, c, [](const tables::Lower& l, char32_t v) { return l.cp < v; });
  if (it == hi || it->cp != c) {
    out.push_back(c);
    return;
  }
  out.push_back(it->a);
  if (it->b) out.push_back(it->b);
}

namespace {

std::string utf8proc_normalize(std::string_view s, NormForm form) {
  int opt = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC: opt |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(opt));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(dst, &std::free);
  MOE_CHECK(n >= 0, "Unicode normalisation failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

bool is_barrier(char32_t c, NormForm form) {
  switch (form) {
    case NormForm::NFC: return in(tables::kBarrierNFC, c);
    case NormForm::NFD: return in(tables::kBarrierNFD, c);
    case NormForm::NFKC: return in(tables::kBarrierNFKC, c);
    case NormForm::NFKD: return in(tables::kBarrierNFKD, c);
  }
  return false;
}

}  // namespace

namespace {

// Code points that a normalisation form leaves as they are and that cannot combine with a
// character before them: a run of them splits the text into parts that normalise
// independently. (Chars below U+0300 are NFC-stable starters and never the second part of
// a composition; CJK ideographs and Hangul syllables neither decompose canonically nor
// follow anything in a composition.)
bool inert(char32_t c, NormForm form) {
  const bool cjk = (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF);
  switch (form) {
    case NormForm::NFC: return c < 0x300 || cjk || (c >= 0xAC00 && c <= 0xD7A3);
    case NormForm::NFKC: return c < 0xA0 || cjk || (c >= 0xAC00 && c <= 0xD7A3);
    case NormForm::NFD: return c < 0xC0 || cjk;
    case NormForm::NFKD: return c < 0xA0 || cjk;
  }
  return false;
}

// Normalises s into out. Code points tokenizers' (older) tables do not know ("barriers")
// stay as they are and separate the text around them, which is normalised on its own.
void normalize_span(std::string_view s, NormForm form, std::string& out) {
  size_t seg = 0, i = 0;
  while (i < s.size()) {
    const size_t b = i;
    const char32_t c = next_cp(s, i);
    if (c >= 0x300 && is_barrier(c, form)) {
      if (b > seg) out += utf8proc_normalize(s.substr(seg, b - seg), form);
      out.append(s.data() + b, i - b);
      seg = i;
    }
  }
  if (seg < s.size()) out += utf8proc_normalize(s.substr(seg), form);
}

}  // namespace

bool is_normalized_quick(std::string_view s, NormForm form) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    if (!inert(next_cp(s, i), form)) return false;
  }
  return true;
}

std::string normalize(std::string_view s, NormForm form) {
  // Copy runs of inert code points; hand every other stretch, together with the starter
  // just before it (it may compose with what follows), to utf8proc.
  std::string out;
  out.reserve(s.size());
  size_t copied = 0;  // s[0, copied) is in `out` or pending in [copied, i)
  size_t prev_start = 0;  // start of the previous (inert) code point
  size_t i = 0;
  while (i < s.size()) {
    const size_t b = i;
    const char32_t c = static_cast<unsigned char>(s[i]) < 0x80 ? static_cast<char32_t>(s[i++]) : next_cp(s, i);
    if (inert(c, form)) {
      prev_start = b;
      continue;
    }
    // A non-inert stretch: from the previous starter (if it is not already emitted) to the
    // next inert code point.
    const size_t from = b > copied ? prev_start : copied;
    out.append(s.data() + copied, from - copied);
    size_t j = i;
    while (j < s.size()) {
      size_t k = j;
      const char32_t d = next_cp(s, k);
      if (inert(d, form)) break;
      j = k;
    }
    normalize_span(s.substr(from, j - from), form, out);
    copied = i = j;
  }
  out.append(s.data() + copied, s.size() - copied);
  return out;
}

int combining_class(char32_t c) {
  if (c < 0x300) return 0;
  return utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
}

char32_t byte_to_cp(uint8_t b) { return byte_table().to_cp[b]; }

int cp_to_byte(char32_t c) {
  const auto& t = byte_table();
  return c < t.to_byte.size() ? t.to_byte[c] : -1;
}

std::string_view byte_to_utf8(uint8_t b) { return byte_table().utf8[b]; }

}  // namespace moe::text::uni
