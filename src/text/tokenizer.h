// Text <-> token ids, as Hugging Face `tokenizers` / `transformers` compute them, from
// the files of a model directory: tokenizer.json (the `tokenizers` format), or
// tokenizer.model (SentencePiece) when there is no tokenizer.json; tokenizer_config.json
// supplies add_bos_token / add_eos_token and the special token strings.
//
// Thread-safety: a loaded Tokenizer is immutable; encode/decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moe::text {

struct EncodeOptions {
  // The post-processor's BOS/EOS (TemplateProcessing, tokenizer_config's add_bos_token),
  // as `tokenizer(text)` / `encode(text)` do by default.
  bool add_special_tokens = true;
  // Read added tokens marked `special` (e.g. <|im_start|>) in the text as control
  // tokens. false: they are ordinary text and encode as the model's pieces, so a
  // user's text cannot inject control tokens (`split_special_tokens=True` in
  // transformers). Non-special added tokens are matched either way. (A tokenizer.model
  // without tokenizer.json: no effect, sentencepiece never reads control symbols in
  // text and always matches user-defined ones; see sp_tokenizer.h.)
  bool parse_special = true;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
};

// The special tokens a chat template and a generation loop need, as strings (empty when
// the model has none) and ids (-1 when none).
struct SpecialTokens {
  std::string bos, eos, unk, pad;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // tokenizer.json if the directory has one, else tokenizer.model; tokenizer_config.json
  // when present. Throws moe::Error naming the file and the problem.
  static std::unique_ptr<Tokenizer> from_dir(const std::string& dir);
  // One tokenizer.json (no tokenizer_config.json).
  static std::unique_ptr<Tokenizer> from_json_file(const std::string& path);
  // tokenizer.json text; `config_json` is tokenizer_config.json's text or empty. `name`
  // appears in errors.
  static std::unique_ptr<Tokenizer> from_json(std::string_view json, std::string_view config_json,
                                              const std::string& name);

  // Invalid UTF-8 in `text` is an error naming the byte offset (moe::Error).
  virtual std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const = 0;
  // Ids out of [0, vocab_size()) are an error naming the id. Bytes that do not form
  // valid UTF-8 decode to U+FFFD, as `tokenizers` does.
  virtual std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& opt = {}) const = 0;

  // Every id the tokenizer can produce is below this (model vocab + added tokens).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  // The token's string as stored in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>").
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual const SpecialTokens& special_tokens() const = 0;
};

// Turns a growing list of ids into text as it is generated: each call returns the text
// that became final, never half a UTF-8 character (and never text a later id could still
// change, e.g. a SentencePiece leading space or a byte-fallback sequence in progress).
// Concatenating every piece plus finish() equals decode(all ids).
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tok, DecodeOptions opt = {}) : tok_(tok), opt_(opt) {}
  std::string push(int32_t id);
  std::string finish();  // whatever is still held back (may contain U+FFFD for cut bytes)
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const Tokenizer& tok_;
  DecodeOptions opt_;
  std::vector<int32_t> ids_;
  size_t emitted_ = 0;  // bytes of decode(ids_) already returned
};

}  // namespace moe::text
