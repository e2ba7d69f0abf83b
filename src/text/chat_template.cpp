// Chat templates: finding a model's template as transformers' tokenizer loading does, and
// rendering a chat with the variables and message clean-up of transformers 5.24's
// apply_chat_template / render_jinja_template (see chat_template.h).
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace moe::text {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

bool read_text(const fs::path& p, std::string& out) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return false;
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

// tokenizer_config.json special-token values are strings or AddedToken dicts.
std::optional<std::string> token_string(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    auto it = v.find("content");
    if (it != v.end() && it->is_string()) return it->get<std::string>();
  }
  return std::nullopt;
}

// transformers' special_tokens_map from tokenizer_config.json: the seven named tokens,
// then every other "<name>_token" key holding a token (the model-specific ones), plus a
// dict-valued extra_special_tokens.
ojson read_special_tokens(const ojson& cfg) {
  static const char* const kNamed[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
  ojson out = ojson::object();
  for (const char* k : kNamed) {
    auto it = cfg.find(k);
    if (it == cfg.end()) continue;
    if (auto s = token_string(*it)) out[k] = *s;
    else out[k] = nullptr;  // mentioned but unset: the tokenizer has none
  }
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    const std::string& k = it.key();
    if (k.size() > 6 && k.compare(k.size() - 6, 6, "_token") == 0 && !out.contains(k))
      if (auto s = token_string(it.value())) out[k] = *s;
  }
  if (auto it = cfg.find("extra_special_tokens"); it != cfg.end() && it->is_object())
    for (auto e = it->begin(); e != it->end(); ++e)
      if (auto s = token_string(e.value())) out[e.key()] = *s;
  return out;
}

std::shared_ptr<jinja::Template> compile(const std::string& source, const std::string& name) {
  return std::make_shared<jinja::Template>(source, name);
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name)
    : source_(source), name_(name), tmpl_(compile(source, name)) {}

ChatTemplate ChatTemplate::from_dir(const std::string& dir, const std::string& explicit_file,
                                    const std::string& template_name) {
  ChatTemplate t;
  const fs::path d(dir);
  std::string text;
  ojson cfg;
  const fs::path cfg_path = d / "tokenizer_config.json";
  if (read_text(cfg_path, text)) {
    try {
      cfg = ojson::parse(text);
    } catch (const nlohmann::json::exception& e) {
      MOE_FAIL("{} is not valid JSON: {}", cfg_path.string(), e.what());
    }
    MOE_CHECK(cfg.is_object(), "{} must hold a JSON object", cfg_path.string());
    t.config_tokens_ = read_special_tokens(cfg);
  }

  if (!explicit_file.empty()) {
    MOE_CHECK(read_text(explicit_file, text), "cannot read the chat template file {}", explicit_file);
    t.source_ = text;
    t.name_ = fs::path(explicit_file).filename().string();
    t.tmpl_ = compile(t.source_, t.name_);
    return t;
  }

  // Named templates: chat_template.jinja is "default", additional_chat_templates/*.jinja
  // the others; else tokenizer_config.json's chat_template (string or named list).
  std::map<std::string, std::pair<std::string, std::string>> named;  // name -> (source, where)
  std::string single, single_where;
  const fs::path jinja_file = d / "chat_template.jinja";
  const fs::path extra_dir = d / "additional_chat_templates";
  if (read_text(jinja_file, text)) named["default"] = {text, jinja_file.filename().string()};
  std::error_code ec;
  if (fs::is_directory(extra_dir, ec)) {
    for (const auto& e : fs::directory_iterator(extra_dir, ec)) {
      if (e.path().extension() != ".jinja" || !read_text(e.path(), text)) continue;
      named[e.path().stem().string()] = {text, "additional_chat_templates/" + e.path().filename().string()};
    }
  }
  if (named.empty() && cfg.is_object()) {
    auto it = cfg.find("chat_template");
    if (it != cfg.end() && it->is_string()) {
      single = it->get<std::string>();
      single_where = "tokenizer_config.json";
    } else if (it != cfg.end() && it->is_array()) {
      for (const auto& e : *it) {
        MOE_CHECK(e.is_object() && e.contains("name") && e.contains("template") && e["name"].is_string() &&
                      e["template"].is_string(),
                  "{}: chat_template list entries must be {{\"name\": ..., \"template\": ...}}", cfg_path.string());
        named[e["name"].get<std::string>()] = {e["template"].get<std::string>(),
                                               "tokenizer_config.json[" + e["name"].get<std::string>() + "]"};
      }
    } else if (it != cfg.end() && !it->is_null()) {
      MOE_FAIL("{}: chat_template must be a string or a list of named templates", cfg_path.string());
    }
  }
  if (named.size() == 1 && named.count("default") && template_name.empty()) {
    single = named["default"].first;
    single_where = named["default"].second;
    named.clear();
  }
  if (!single_where.empty()) {
    MOE_CHECK(template_name.empty() || template_name == "default",
              "the chat template of {} has no name '{}' (it is a single template)", dir, template_name);
    t.source_ = single;
    t.name_ = single_where;
    t.tmpl_ = compile(single, single_where);
    return t;
  }
  if (named.empty()) {
    MOE_FAIL("no chat template in {}: looked for chat_template.jinja, additional_chat_templates/*.jinja and "
             "\"chat_template\" in tokenizer_config.json{}; give one with --chat-template FILE",
             dir, cfg.is_object() ? "" : " (there is no tokenizer_config.json)");
  }
  std::string names;
  for (const auto& [n, v] : named) names += (names.empty() ? "" : ", ") + n;
  std::string pick = template_name;
  if (pick.empty()) {
    MOE_CHECK(named.count("default"),
              "{} has several chat templates ({}) and none is named 'default': choose one by name", dir, names);
    pick = "default";
    if (auto it = named.find("tool_use"); it != named.end()) {
      t.tool_source_ = it->second.first;
      t.tool_tmpl_ = compile(it->second.first, it->second.second);
    }
  }
  auto it = named.find(pick);
  MOE_CHECK(it != named.end(), "{} has no chat template named '{}' (it has: {})", dir, pick, names);
  t.source_ = it->second.first;
  t.name_ = it->second.second;
  t.tmpl_ = compile(t.source_, t.name_);
  return t;
}

std::string ChatTemplate::render(const ChatRequest& req, const SpecialTokens& special) const {
  ojson map = ojson::object();
  for (auto it = config_tokens_.begin(); it != config_tokens_.end(); ++it)
    if (it->is_string()) map[it.key()] = *it;
  auto fill = [&](const char* key, const std::string& v) {
    if (!config_tokens_.contains(key) && !v.empty()) map[key] = v;
  };
  fill("bos_token", special.bos);
  fill("eos_token", special.eos);
  fill("unk_token", special.unk);
  fill("pad_token", special.pad);
  return render(req, map);
}

std::string ChatTemplate::render(const ChatRequest& req, const ojson& special_tokens_map) const {
  MOE_CHECK(req.messages.is_array(), "the chat must be a list of messages, got {}", req.messages.type_name());
  MOE_CHECK(!req.messages.empty(), "Cannot apply chat template to an empty conversation. Provide at least one message.");
  MOE_CHECK(req.tools.is_null() || req.tools.is_array(), "tools must be a list of tool schemas, got {}",
            req.tools.type_name());
  MOE_CHECK(req.kwargs.is_null() || req.kwargs.is_object(), "template kwargs must be an object, got {}",
            req.kwargs.type_name());

  // _normalize_chat_messages, then _alias_reasoning_fields.
  ojson messages = ojson::array();
  for (size_t i = 0; i < req.messages.size(); ++i) {
    const ojson& m = req.messages[i];
    MOE_CHECK(m.is_object(), "Chat messages should be dicts, but message {} is {}", i, m.dump());
    ojson clean = ojson::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it->is_null()) clean[it.key()] = *it;
    const ojson* reasoning = nullptr;
    for (const char* k : {"reasoning_content", "thinking", "reasoning"}) {
      auto f = clean.find(k);
      if (f != clean.end()) {
        reasoning = &*f;
        break;
      }
    }
    if (reasoning) {
      ojson r = *reasoning;
      ojson aliased = ojson::object();
      aliased["thinking"] = r;
      // {"thinking": r, **message, "reasoning_content": r}: a message's own "thinking"
      // keeps its value (in first position).
      for (auto it = clean.begin(); it != clean.end(); ++it) aliased[it.key()] = *it;
      aliased["reasoning_content"] = r;
      clean = std::move(aliased);
    }
    messages.push_back(std::move(clean));
  }

  ojson ctx = ojson::object();
  ctx["messages"] = std::move(messages);
  ctx["tools"] = req.tools;
  ctx["documents"] = req.documents;
  ctx["add_generation_prompt"] = req.add_generation_prompt;
  if (special_tokens_map.is_object())
    for (auto it = special_tokens_map.begin(); it != special_tokens_map.end(); ++it)
      if (!it->is_null()) ctx[it.key()] = *it;
  if (req.kwargs.is_object()) {
    for (auto it = req.kwargs.begin(); it != req.kwargs.end(); ++it) {
      const std::string& k = it.key();
      MOE_CHECK(k != "messages" && k != "tools" && k != "documents" && k != "add_generation_prompt",
                "template kwargs cannot set '{}' (render() got multiple values for it)", k);
      ctx[k] = *it;
    }
  }
  const jinja::Template& t = !req.tools.is_null() && tool_tmpl_ ? *tool_tmpl_ : *tmpl_;
  return t.render(ctx);
}

}  // namespace moe::text
