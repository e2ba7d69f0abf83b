#include "cli/text_opts.h"

#include <CLI/CLI.hpp>

#include <fstream>
#include <sstream>

#include "core/check.h"
#include "loader/gguf/gguf_checkpoint.h"
#include "loader/gguf/gguf_tokenizer.h"

namespace moe {

void add_chat_flags(CLI::App* cmd, ChatFlags& f) {
  cmd->add_option("--chat-template", f.chat_template_file,
                  "Jinja chat template file to use instead of the model's (chat_template.jinja, or "
                  "tokenizer_config.json's chat_template)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--template-kwargs", f.template_kwargs,
                  "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}' for Qwen3");
  cmd->add_option("--tools-file", f.tools_file, "JSON list of tool (function) schemas passed to the template as `tools`")
      ->check(CLI::ExistingFile);
}

nlohmann::ordered_json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "{}: cannot read {}", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL("{} {} is not valid JSON: {}", what, path, e.what());
  }
}

namespace {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "{}: cannot read {}", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

gguf::TokenizerFiles gguf_tokenizer_files(const std::string& path) {
  const gguf::GgufModel m = gguf::GgufModel::open(path);  // the metadata is the first part's
  return gguf::tokenizer_files(m.metadata(), path);
}

}  // namespace

std::unique_ptr<text::Tokenizer> load_tokenizer(const std::string& dir) {
  if (!gguf::is_gguf_file(dir)) return text::Tokenizer::from_dir(dir);
  const gguf::TokenizerFiles files = gguf_tokenizer_files(dir);
  return text::Tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json, dir);
}

TextModel load_text_model(const std::string& dir, const ChatFlags& f) {
  TextModel tm;
  if (gguf::is_gguf_file(dir)) {
    const gguf::TokenizerFiles files = gguf_tokenizer_files(dir);
    tm.tok = text::Tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json, dir);
    if (!f.chat_template_file.empty())
      tm.tmpl = std::make_unique<text::ChatTemplate>(read_text_file(f.chat_template_file, "--chat-template"),
                                                     f.chat_template_file);
    else if (!files.chat_template.empty())
      tm.tmpl = std::make_unique<text::ChatTemplate>(files.chat_template, dir + " (tokenizer.chat_template)");
    else
      tm.template_error = fmt::format("{} has no tokenizer.chat_template", dir);
    return tm;
  }
  tm.tok = text::Tokenizer::from_dir(dir);
  try {
    tm.tmpl = std::make_unique<text::ChatTemplate>(text::ChatTemplate::from_dir(dir, f.chat_template_file));
  } catch (const Error& e) {
    if (!f.chat_template_file.empty()) throw;  // asked for explicitly: a broken file is an error now
    tm.template_error = e.what();
  }
  return tm;
}

std::string render_chat(const TextModel& tm, const ChatFlags& f, const nlohmann::ordered_json& messages,
                        bool add_generation_prompt) {
  MOE_CHECK(tm.tmpl, "this model has no chat template ({}); give one with --chat-template FILE", tm.template_error);
  MOE_CHECK(messages.is_array(), "the chat must be a JSON list of messages ({{\"role\": ..., \"content\": ...}}), got {}",
            messages.type_name());
  text::ChatRequest req;
  req.messages = messages;
  req.add_generation_prompt = add_generation_prompt;
  if (!f.template_kwargs.empty()) {
    try {
      req.kwargs = nlohmann::ordered_json::parse(f.template_kwargs);
    } catch (const nlohmann::json::exception& e) {
      MOE_FAIL("--template-kwargs is not valid JSON: {}", e.what());
    }
    MOE_CHECK(req.kwargs.is_object(), "--template-kwargs must be a JSON object, got {}", req.kwargs.type_name());
  }
  if (!f.tools_file.empty()) {
    req.tools = read_json_file(f.tools_file, "--tools-file");
    MOE_CHECK(req.tools.is_array(), "--tools-file must hold a JSON list of tools, got {}", req.tools.type_name());
  }
  return tm.tmpl->render(req, tm.tok->special_tokens());
}

std::vector<int32_t> encode_rendered_chat(const text::Tokenizer& tok, const std::string& rendered) {
  text::EncodeOptions eo;
  eo.add_special_tokens = false;
  eo.parse_special = true;
  return tok.encode(rendered, eo);
}

std::vector<int64_t> tokenizer_stop_ids(const text::Tokenizer& tok) {
  std::vector<int64_t> ids;
  if (tok.special_tokens().eos_id >= 0) ids.push_back(tok.special_tokens().eos_id);
  return ids;
}

}  // namespace moe
