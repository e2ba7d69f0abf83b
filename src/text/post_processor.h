// tokenizer.json "post_processor" for single sequences: TemplateProcessing (its "single"
// template; "pair" is parsed and checked but not used), BertProcessing,
// RobertaProcessing, ByteLevel (ids unchanged), Sequence. With add_special_tokens false
// they add nothing, as in `tokenizers`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/json_util.h"

namespace moe::text {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
  // The special tokens it adds in front of / after a single sequence (strings and ids).
  virtual void added_tokens(std::vector<std::pair<std::string, int32_t>>& front,
                            std::vector<std::pair<std::string, int32_t>>& back) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const js::json& j, const std::string& where);

}  // namespace moe::text
