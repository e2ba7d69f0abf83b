// UTF-8 and Unicode helpers for the tokenizer, matching what Hugging Face `tokenizers`
// gets from Rust: `String::from_utf8_lossy` (one U+FFFD per maximal invalid subpart),
// `char::is_whitespace` (White_Space), `char::is_numeric` (N*), the `unicode_categories`
// predicates (is_punctuation = P*, Cc/Cf/Co, is_mark_nonspacing = Mn), `\w` of the
// `regex` crate, `char::to_lowercase`, NFC/NFD/NFKC/NFKD (utf8proc here, the
// `unicode-normalization` crate there) and the GPT-2 byte <-> unicode table of ByteLevel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moe::text::uni {

// Offset of the first byte that does not start a valid UTF-8 sequence, or npos.
size_t find_invalid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
inline char32_t next_cp(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t c = ((b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    i += 2;
    return c;
  }
  if (b0 < 0xF0) {
    char32_t c = ((b0 & 0x0F) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
                 (static_cast<unsigned char>(s[i + 2]) & 0x3F);
    i += 3;
    return c;
  }
  char32_t c = ((b0 & 0x07) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
               ((static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3F);
  i += 4;
  return c;
}

// Byte length of the UTF-8 sequence starting with lead byte b (1 for invalid leads).
inline size_t seq_len(unsigned char b) { return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }
inline size_t cp_len(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }
// Start of the code point that ends at s[end-1] (s valid UTF-8, end > 0).
inline size_t prev_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

void append_utf8(std::string& out, char32_t c);
std::string to_utf8(char32_t c);

// Rust String::from_utf8_lossy.
std::string from_utf8_lossy(std::string_view bytes);

// Character classes as HF tokenizers applies them (tables generated from tokenizers
// itself by tools/gen_unicode_tables.py; see unicode_tables.inc).
bool is_whitespace(char32_t c);       // Rust char::is_whitespace (White_Space property)
bool is_numeric(char32_t c);          // Rust char::is_numeric (Digits)
bool is_punctuation(char32_t c);      // ASCII punctuation or unicode_categories P* (Punctuation, Bert)
bool is_bert_control(char32_t c);     // removed by BertNormalizer clean_text (NUL, U+FFFD, Cc/Cf/Co but \t\n\r)
bool is_mark_nonspacing(char32_t c);  // unicode_categories Mn (BertNormalizer strip_accents)
bool is_mark(char32_t c);             // is_combining_mark (StripAccents)
bool is_word_char(char32_t c);        // regex crate \w (Whitespace, AddedToken single_word)

// Rust char::to_lowercase: appends the lowercase mapping of c (1 or more code points).
void append_lowercase(std::u32string& out, char32_t c);

enum class NormForm { NFC, NFD, NFKC, NFKD };
// Unicode normalisation of valid UTF-8, as tokenizers' normalizers compute it.
std::string normalize(std::string_view s, NormForm form);
// True when s certainly comes out of normalize(s, form) unchanged (a quick scan: ASCII,
// CJK ideographs, ...); false means "maybe not".
bool is_normalized_quick(std::string_view s, NormForm form);
// Canonical combining class (0 for starters).
int combining_class(char32_t c);

// GPT-2 ByteLevel: byte -> code point, and code point -> byte (-1 when not in the table).
char32_t byte_to_cp(uint8_t b);
int cp_to_byte(char32_t c);
// The UTF-8 of byte_to_cp(b), precomputed.
std::string_view byte_to_utf8(uint8_t b);

}  // namespace moe::text::uni
