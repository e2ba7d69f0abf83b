#include "serve/grammar/vocab.h"

#include <algorithm>
#include <cstdio>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace moe::serve::grammar {

const std::vector<std::string> kFormatMarkers = {
    "<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>"};

namespace {

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
    byte_level = byte_level && has_token(tok, std::string(text::uni::byte_to_utf8(static_cast<uint8_t>(b))));
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
      if (text::uni::find_invalid_utf8(s) != std::string::npos) return s;
      std::string out;
      for (size_t i = 0; i < s.size();) {
        const int b = text::uni::cp_to_byte(text::uni::next_cp(s, i));
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
