// The text each token adds to a reply, as a grammar engine must match it.
//
// A vocabulary stores its tokens encoded (id_to_token): byte-level BPE (GPT-2, Qwen,
// DeepSeek) as one printable character per byte ("Ġthe"), SentencePiece with byte
// fallback (Llama, Mistral) with "▁" for a space and "<0x0A>" for a raw byte. Decoding
// one token alone (Tokenizer::decode) is no answer: it drops a SentencePiece token's
// leading space and turns a byte-level token that holds part of a UTF-8 character into
// U+FFFD. So the bytes are read back from the stored strings here, by the rule of the
// vocabulary's kind, which the vocabulary itself shows (all 256 byte-level characters,
// or all 256 <0xNN> tokens).
//
// Special (control) tokens add no text: they are "" here, which the grammar engine
// never allows, so a JSON string cannot contain <|im_end|>. Except the markers a
// reasoning or tool-call format writes (kFormatMarkers: Mistral's [TOOL_CALLS] is a
// control token, and so are the think tags of some vocabularies): those keep their text,
// so a required tool call can be written with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::text {
class Tokenizer;
}

namespace moe::serve::grammar {

enum class VocabKind { byte_level, byte_fallback, raw };

struct GrammarVocab {
  VocabKind kind = VocabKind::raw;
  std::vector<std::string> text;  // [min(tokenizer vocab, model vocab)]: the bytes token id adds ("" : none)
};

// The special tokens that keep their text (see above).
extern const std::vector<std::string> kFormatMarkers;

// model_vocab: the logits' width (ids at or past the tokenizer's vocabulary are never
// produced and get no entry).
GrammarVocab grammar_vocab(const text::Tokenizer& tok, int64_t model_vocab);

}  // namespace moe::serve::grammar
