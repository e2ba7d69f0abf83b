// tokenizer.json "decoder": ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
// WordPiece, BPEDecoder, CTC, Sequence. As in `tokenizers`, each one maps the list of
// token strings to a new list (decode_chain) and decode() joins the final list.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/json_util.h"

namespace moe::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  std::string decode(std::vector<std::string> tokens) const {
    decode_chain(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }
};

std::unique_ptr<Decoder> make_decoder(const js::json& j, const std::string& where);

}  // namespace moe::text
