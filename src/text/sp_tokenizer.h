// A tokenizer.model (SentencePiece protobuf) without tokenizer.json, through
// libsentencepiece: ids are sentencepiece's own Encode (as `sp.encode(text)` in Python),
// BOS / EOS are added only when tokenizer_config.json's add_bos_token / add_eos_token
// say so (both default to false), decode is sentencepiece's Decode.
//
// Special tokens: sentencepiece never reads control symbols (<s>, </s>, <mask:N>) in text
// and always matches user-defined symbols, whatever EncodeOptions::parse_special says
// (so parse_special has no effect here). skip_special_tokens drops control and unknown
// pieces; is_special() is true for exactly those.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "text/tokenizer.h"

namespace moe::text {

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(std::string_view model_bytes, std::string_view config_json,
                                                        const std::string& name);

}  // namespace moe::text
