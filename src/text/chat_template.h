// A model's chat template and its rendering, as transformers' apply_chat_template(...,
// tokenize=False) does it.
//
// Where the template comes from, first found wins: an explicit file (--chat-template),
// chat_template.jinja in the model directory (with additional_chat_templates/*.jinja as
// named templates), tokenizer_config.json's "chat_template" (a string, or a list of
// {"name", "template"}: "default" is used, or the one named by `template_name`, e.g.
// "tool_use"; with no `template_name`, a request with tools uses "tool_use" when there is
// one, as transformers' get_chat_template does).
//
// What render() replicates of transformers 5.24 (apply_chat_template ->
// render_jinja_template):
//  * each message drops its keys whose value is null (content: null next to tool_calls
//    becomes "no content key");
//  * a message with reasoning_content / thinking / reasoning (the first non-null) gets
//    it under both "thinking" (first key) and "reasoning_content" (last key);
//  * variables: messages, tools (None when the request has none), documents (None),
//    add_generation_prompt, the tokenizer's special_tokens_map (only the tokens that are
//    set, as strings: bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
//    mask_token and every other "<name>_token" string of tokenizer_config.json), then
//    the request's kwargs (kwargs win over special tokens);
//  * an empty message list is an error, as in transformers.
// Tool definitions and tool-call arguments are passed through unchanged (transformers
// converts neither). Key order matters (tojson, dict iteration): pass JSON parsed as
// nlohmann::ordered_json to keep the client's order.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"
#include "text/tokenizer.h"

namespace moe::text {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI-style [{role, content, ...}]
  nlohmann::ordered_json tools;                                       // null or a list of tool schemas
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();   // extra template variables (enable_thinking, ...)
  nlohmann::ordered_json documents;                                   // null or a list of {title, text} (RAG)
};

class ChatTemplate {
 public:
  // Throws moe::Error when no template is found (naming the places looked at) or it does
  // not parse (naming the line).
  static ChatTemplate from_dir(const std::string& dir, const std::string& explicit_file = "",
                               const std::string& template_name = "");
  ChatTemplate(const std::string& source, const std::string& name);

  // special: the tokenizer's special token strings (bos_token, eos_token, ...), passed as
  // transformers passes them. Tokens named in tokenizer_config.json (read by from_dir)
  // come from there; `special` fills bos/eos/unk/pad the config does not mention.
  std::string render(const ChatRequest& req, const SpecialTokens& special) const;
  // The same with transformers' special_tokens_map given in full ({"bos_token": "<s>", ...}).
  std::string render(const ChatRequest& req, const nlohmann::ordered_json& special_tokens_map) const;

  const std::string& source() const { return source_; }
  const std::string& name() const { return name_; }
  // "<name>_token" strings of tokenizer_config.json (empty unless from_dir read one).
  const nlohmann::ordered_json& config_special_tokens() const { return config_tokens_; }

 private:
  ChatTemplate() = default;
  std::string source_, name_;
  std::shared_ptr<jinja::Template> tmpl_;
  // With named templates and no explicit choice: the "tool_use" one, for requests with tools.
  std::string tool_source_;
  std::shared_ptr<jinja::Template> tool_tmpl_;
  nlohmann::ordered_json config_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace moe::text
