// What the text verbs share: the tokenizer and chat template of --model, the template
// flags, and turning --prompt / --chat / --chat-file into token ids.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace CLI {
class App;
}

namespace moe {

struct ChatFlags {
  std::string chat_template_file;  // --chat-template
  std::string template_kwargs;     // --template-kwargs JSON object
  std::string tools_file;          // --tools-file
};

// --chat-template, --template-kwargs, --tools-file.
void add_chat_flags(CLI::App* cmd, ChatFlags& f);

struct TextModel {
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<text::ChatTemplate> tmpl;  // nullptr: no template found (error only when a chat needs it)
  std::string template_error;               // why there is none
};

// The tokenizer of `dir` (tokenizer.json or tokenizer.model) and its chat template; or,
// for a GGUF file, those its tokenizer.ggml.* and tokenizer.chat_template metadata hold
// (loader/gguf/gguf_tokenizer.h).
TextModel load_text_model(const std::string& dir, const ChatFlags& f);
// Just the tokenizer of a directory or a GGUF file.
std::unique_ptr<text::Tokenizer> load_tokenizer(const std::string& dir);

// A JSON file (what: "--chat-file") parsed, with errors naming it.
// Keys keep the file's order (ordered_json): a template's tojson prints them in that
// order, as Python's json does.
nlohmann::ordered_json read_json_file(const std::string& path, const std::string& what);

// The rendered prompt of `messages` (an OpenAI-style list), as transformers'
// apply_chat_template(..., tokenize=False) renders it.
std::string render_chat(const TextModel& tm, const ChatFlags& f, const nlohmann::ordered_json& messages,
                        bool add_generation_prompt);

// The ids of a rendered chat: special tokens in it are read as control tokens (the
// template wrote them) and nothing is added (the template writes BOS where the model
// wants one), as apply_chat_template(..., tokenize=True) does.
std::vector<int32_t> encode_rendered_chat(const text::Tokenizer& tok, const std::string& rendered);

// Ids that end a generation: the tokenizer's eos token (for chat models the template's
// end-of-turn token, e.g. <|im_end|>) beside the config's eos_token_id.
std::vector<int64_t> tokenizer_stop_ids(const text::Tokenizer& tok);

}  // namespace moe
