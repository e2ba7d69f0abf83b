// The grammar engine behind grammar.h: xgrammar (Apache-2.0; vLLM's, SGLang's and
// TensorRT-LLM's), built by scripts/setup.sh from its pinned source release.
//
// One compiler per served model: the vocabulary's token texts (vocab.h) and the stop
// tokens go to xgrammar once, at start. Compiled grammars are cached by xgrammar, keyed
// by the format's text (so the same schema or tool list compiles once), up to
// kCacheBytes; the masks of a matcher are xgrammar's own (precomputed per grammar state,
// so a mask costs a walk over the few context-dependent tokens, not the vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "serve/grammar/grammar.h"
#include "serve/grammar/vocab.h"

namespace moe::text {
class Tokenizer;
}

namespace moe::serve::grammar {

class XgrammarCompiler final : public Compiler {
 public:
  // model_vocab: the logits' width; stop_ids: the tokens that end a reply (the engine's
  // EOS ids), the only ones a complete grammar allows.
  XgrammarCompiler(const text::Tokenizer& tok, int64_t model_vocab, const std::vector<int64_t>& stop_ids);
  ~XgrammarCompiler() override;
  std::shared_ptr<const Grammar> compile(const nlohmann::ordered_json& format) const override;
  VocabKind vocab_kind() const { return kind_; }

  // Compiled grammars kept for reuse (xgrammar's cache limit).
  static constexpr int64_t kCacheBytes = int64_t{256} << 20;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  VocabKind kind_;
};

}  // namespace moe::serve::grammar
