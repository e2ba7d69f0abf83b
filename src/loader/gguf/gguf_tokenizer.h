// The tokenizer of a GGUF file (its tokenizer.ggml.* metadata, as llama.cpp's
// convert_hf_to_gguf.py writes it and llama.cpp's llama-vocab.cpp reads it), turned
// into the text of an equivalent Hugging Face tokenizer.json and tokenizer_config.json,
// so that text::Tokenizer::from_json runs it and text::ChatTemplate renders its template:
//
//   auto f = moe::gguf::GgufFile::open(path);
//   auto files = moe::gguf::tokenizer_files(f->metadata(), path);
//   auto tok = moe::text::Tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json, path);
//
// Supported:
//  * tokenizer.ggml.model "gpt2": byte-level BPE with tokenizer.ggml.merges. The
//    pre-tokenizer comes from tokenizer.ggml.pre, mapped to the normalizer and the
//    pre-tokenizer of the published tokenizer.json of that family: qwen2 (Qwen2, Qwen3,
//    Qwen3-MoE; also deepseek-r1-qwen), deepseek-v3, deepseek-llm, llama-bpe (Llama 3;
//    also llama3, llama-v3; with ignore_merges), gpt-2, and default (llama.cpp's own
//    fallback regexes for a BPE file without a known pre-tokenizer).
//  * tokenizer.ggml.model "llama": SentencePiece BPE (Llama 2, Mistral, Mixtral) with
//    tokenizer.ggml.scores, in the form transformers' LlamaConverter writes (legacy
//    Prepend + Replace normalizer, BPE with byte_fallback); the merges are derived from
//    the scores as transformers' generate_merges does, since such files carry none.
// Every token keeps its id (model.vocab holds them all); CONTROL and UNKNOWN tokens
// become special added tokens and USER_DEFINED ones non-special added tokens, all
// matched on the raw text (normalized: false) without stripping, as llama.cpp matches
// them. BOS/EOS are added by a TemplateProcessing post-processor when
// tokenizer.ggml.add_bos_token / add_eos_token (or llama.cpp's default for the model)
// say so, since from_json takes BOS/EOS from the post-processor alone.
#pragma once

#include <string>

#include "loader/gguf/gguf_file.h"

namespace moe::gguf {

struct TokenizerFiles {
  std::string tokenizer_json;         // the text of an equivalent tokenizer.json
  std::string tokenizer_config_json;  // bos/eos/unk/pad_token, add_bos/eos_token, chat_template if present
  std::string chat_template;          // tokenizer.chat_template, empty if absent
};

// Throws moe::Error naming the file and the key for a missing or ill-typed key, an
// unknown tokenizer.ggml.model or tokenizer.ggml.pre (listing the supported ones),
// arrays of different lengths, a duplicate token, a merge naming a token not in the
// vocabulary, a special token id out of range, or a string that is not UTF-8.
TokenizerFiles tokenizer_files(const Metadata& md, const std::string& file_name);

}  // namespace moe::gguf
