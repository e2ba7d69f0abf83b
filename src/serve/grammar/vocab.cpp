#include "serve/grammar/vocab.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>

#include "text/tokenizer.h"

namespace moe::serve::grammar {

const std::vector<std::string> kFormatMarkers = {
    "<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>"};

namespace {

// GPT-2's bytes_to_unicode: bytes 33-126, 161-172 and 174-255 stand for themselves;
// the other 68 take the code points 256, 257, ... in byte order.
const std::array<char32_t, 256>& byte_chars() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = self ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

void put_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The code points of valid UTF-8 `s`, or nullopt.
std::optional<std::u32string> code_points(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return std::nullopt;
    char32_t c = n == 1 ? b : b & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const auto cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xC0) != 0x80) return std::nullopt;
      c = (c << 6) | (cb & 0x3F);
    }
    out += c;
    i += n;
  }
  return out;
}

std::string token_string(const text::Tokenizer& tok, int32_t id) {
  try {
    return tok.id_to_token(id);
  } catch (...) {  // a hole in the vocabulary: no token has this id
    return {};
  }
}

bool has_token(const text::Tokenizer& tok, const std::string& s) { return tok.token_to_id(s).has_value(); }

VocabKind detect_kind(const text::Tokenizer& tok) {
  bool byte_level = true, byte_fallback = true;
  for (int b = 0; b < 256 && (byte_level || byte_fallback); ++b) {
    std::string c;
    put_utf8(byte_chars()[b], c);
    byte_level = byte_level && has_token(tok, c);
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    byte_fallback = byte_fallback && has_token(tok, hex);
  }
  return byte_level ? VocabKind::byte_level : byte_fallback ? VocabKind::byte_fallback : VocabKind::raw;
}

// "▁" (U+2581), SentencePiece's space.
constexpr char kMeta[] = "\xE2\x96\x81";

std::string replace_meta(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, kMeta) == 0) {
      out += ' ';
      i += 3;
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::string token_text(VocabKind kind, const std::string& s) {
  switch (kind) {
    case VocabKind::byte_level: {
      // A character outside the table means an added token stored as its own text
      // (DeepSeek's "<｜tool▁sep｜>").
      const auto cps = code_points(s);
      if (!cps) return s;
      std::string out;
      for (char32_t c : *cps) {
        const int b = byte_level_byte(c);
        if (b < 0) return s;
        out += static_cast<char>(b);
      }
      return out;
    }
    case VocabKind::byte_fallback: {
      unsigned v = 0;
      if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && std::sscanf(s.c_str() + 3, "%2X", &v) == 1)
        return std::string(1, static_cast<char>(v));
      return replace_meta(s);
    }
    case VocabKind::raw:
      return replace_meta(s);
  }
  return s;
}

}  // namespace

int byte_level_byte(char32_t c) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(256 + 68, -1);
    for (int b = 0; b < 256; ++b) inv[byte_chars()[b]] = b;
    return inv;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

GrammarVocab grammar_vocab(const text::Tokenizer& tok, int64_t model_vocab) {
  GrammarVocab v;
  v.kind = detect_kind(tok);
  const int64_t n = std::min(tok.vocab_size(), model_vocab);
  v.text.resize(static_cast<size_t>(n));
  for (int64_t id = 0; id < n; ++id) {
    const auto i = static_cast<int32_t>(id);
    const std::string s = token_string(tok, i);
    if (tok.is_special(i)) {
      if (std::find(kFormatMarkers.begin(), kFormatMarkers.end(), s) != kFormatMarkers.end()) v.text[id] = s;
      continue;
    }
    v.text[id] = token_text(v.kind, s);
  }
  return v;
}

}  // namespace moe::serve::grammar
