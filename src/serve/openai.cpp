#include "serve/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <random>

#include "serve/grammar/grammar.h"
#include "serve/grammar/structural.h"
#include "serve/parsers/text_scan.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace moe::serve {

using json = Json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message, int status = 400,
                      const std::string& code = "") {
  throw ServeError{status, "invalid_request_error", message, param, code};
}

// The deepest nesting of arrays/objects in a JSON text, stopping early past `limit`.
// A byte scan (strings skipped) is enough: the parser rejects what is not JSON anyway.
int json_depth(std::string_view s, int limit) {
  int depth = 0, deepest = 0;
  parsers::scan_json_brackets(s, 0, [&](char c, size_t) {
    if (c == '{' || c == '[') deepest = std::max(deepest, ++depth);
    else --depth;
    return deepest <= limit;
  });
  return deepest;
}

uint64_t random_u64() {
  // One generator per thread: ids and seeds must differ between requests, not be secret.
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }());
  return rng();
}

// Typed access to the fields of a request object. Absent and null fields are the same
// (OpenAI clients send null for "not set"); a present field of the wrong type is a 400
// naming it.
class Fields {
 public:
  // prefix: where this object sits in the request ("messages[2]."), for error messages.
  explicit Fields(const json& j, std::string prefix = "") : j_(j), prefix_(std::move(prefix)) {}

  const json* get(const std::string& name) const {
    auto it = j_.find(name);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool boolean(const std::string& name, bool def) const {
    const json* v = get(name);
    if (!v) return def;
    if (!v->is_boolean()) wrong_type(prefix_ + name, "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<double> number(const std::string& name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(prefix_ + name, "a number", *v);
    return v->get<double>();
  }
  double number_in(const std::string& name, double def, double lo, double hi, bool lo_open = false) const {
    auto v = number(name);
    if (!v) return def;
    if (!(lo_open ? *v > lo : *v >= lo) || !(*v <= hi))
      bad(name, fmt::format("'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, *v));
    return *v;
  }
  std::optional<int64_t> integer(const std::string& name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    return as_integer(prefix_ + name, *v);
  }
  static int64_t as_integer(const std::string& name, const json& v) {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        bad(name, fmt::format("'{}' is too large: {}", name, v.get<uint64_t>()));
      return int64_t(v.get<uint64_t>());
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    // 16.0 is an integer to JavaScript clients; 16.5 is not.
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return int64_t(d);
    }
    wrong_type(name, "an integer", v);
  }
  std::string string(const std::string& name) const {
    const json* v = get(name);
    if (!v) return "";
    if (!v->is_string()) wrong_type(prefix_ + name, "a string", *v);
    return v->get<std::string>();
  }
  [[noreturn]] static void wrong_type(const std::string& name, const char* expected, const json& got) {
    bad(name, fmt::format("'{}' must be {}, got {}", name, expected, got.type_name()));
  }

 private:
  const json& j_;
  std::string prefix_;
};

// Content as a string or null: a list of text parts is joined with newlines (as vLLM
// renders the "string" content format), so templates that expect a string work.
json message_content(const json& c, const std::string& param) {
  if (c.is_null() || c.is_string()) return c;
  if (!c.is_array()) Fields::wrong_type(param, "a string, a list of content parts or null", c);
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const json& part = c[i];
    if (!part.is_object()) Fields::wrong_type(p, "a content part object", part);
    Fields f(part, p + ".");
    const std::string type = f.string("type");
    if (type != "text")
      bad(p + ".type", fmt::format("content part type '{}' is not supported: only 'text' parts", type));
    if (!f.get("text")) bad(p + ".text", "a text part needs 'text'");
    if (i) text += '\n';
    text += f.string("text");
  }
  return text;
}

json check_messages(const json* msgs) {
  if (!msgs) bad("messages", "'messages' is required");
  if (!msgs->is_array()) Fields::wrong_type("messages", "a list of messages", *msgs);
  if (msgs->empty()) bad("messages", "'messages' must contain at least one message");
  json out = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string p = fmt::format("messages[{}]", i);
    const json& m = (*msgs)[i];
    if (!m.is_object()) Fields::wrong_type(p, "a message object", m);
    Fields f(m, p + ".");
    std::string role = f.string("role");
    if (role.empty()) bad(p + ".role", "every message needs a 'role'");
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      bad(p + ".role",
          fmt::format("unknown role '{}': expected system, user, assistant, tool or developer", role));
    // Chat templates know "system"; OpenAI's "developer" is its newer name.
    if (role == "developer") role = "system";
    // Other keys pass through to the template (it may use them); the known ones are checked.
    json msg = m;
    msg["role"] = role;
    msg["content"] = message_content(m.contains("content") ? m["content"] : json(), p + ".content");
    for (const char* key : {"tool_call_id", "name", "reasoning_content"})
      if (f.get(key)) f.string(key);  // type check only
    if (const json* calls = f.get("tool_calls")) {
      if (!calls->is_array()) Fields::wrong_type(p + ".tool_calls", "a list", *calls);
      for (size_t k = 0; k < calls->size(); ++k) {
        const std::string cp = fmt::format("{}.tool_calls[{}]", p, k);
        json& call = msg["tool_calls"][k];
        if (!call.is_object()) Fields::wrong_type(cp, "a tool call object", call);
        auto fn = call.find("function");
        if (fn == call.end() || !fn->is_object()) bad(cp + ".function", "a tool call needs a 'function' object");
        // OpenAI sends arguments as a JSON string; templates index them as a mapping
        // (transformers' convention), so parse them when they are an object (vLLM does too).
        auto args = fn->find("arguments");
        if (args != fn->end() && args->is_string()) {
          json parsed = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (parsed.is_object()) *args = std::move(parsed);
        }
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// The prompt of /v1/completions as token ids; *echo gets its text.
std::vector<int32_t> completion_prompt(const json* prompt, const ModelContext& m, std::string* echo) {
  if (!prompt) bad("prompt", "'prompt' is required");
  const json* p = prompt;
  // A one-element list of a string or of ids is the same prompt; more is a batch.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    *echo = p->get<std::string>();
    text::EncodeOptions opt;
    opt.add_special_tokens = true;
    opt.parse_special = true;
    try {
      return m.tokenizer->encode(*echo, opt);
    } catch (const std::exception& e) {
      bad("prompt", fmt::format("the prompt could not be tokenized: {}", e.what()));
    }
  }
  if (!p->is_array()) Fields::wrong_type("prompt", "a string or a list of token ids", *p);
  std::vector<int32_t> ids;
  ids.reserve(p->size());
  const int64_t vocab = m.tokenizer->vocab_size();
  for (size_t i = 0; i < p->size(); ++i) {
    const json& v = (*p)[i];
    if (v.is_string() || v.is_array())
      bad("prompt", "batched prompts (a list of several prompts) are not supported: send one prompt per request");
    const int64_t id = Fields::as_integer(fmt::format("prompt[{}]", i), v);
    if (id < 0 || id >= vocab)
      bad("prompt", fmt::format("token id {} at prompt[{}] is out of range [0, {})", id, i, vocab));
    ids.push_back(int32_t(id));
  }
  try {
    *echo = m.tokenizer->decode(ids);
  } catch (const std::exception&) {
    echo->clear();  // ids are in range, so this does not happen; echo is best effort
  }
  return ids;
}

// The names of the request's tools (each {"type": "function", "function": {"name"}}).
std::vector<std::string> tool_names(const json& tools) {
  std::vector<std::string> names;
  for (const json& t : tools) {
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) continue;
    auto n = fn->find("name");
    if (n != fn->end() && n->is_string()) names.push_back(n->get<std::string>());
  }
  return names;
}

// tool_choice: "auto" (the default), "none", "required" or {"type": "function",
// "function": {"name": N}}. Sets what the reply's parser looks for; "none" also keeps
// the tools from the template (vLLM passes them unless tool_choice is "none").
// *forced: "required" or a named function, which the reply's grammar then enforces.
void tool_choice(const Fields& f, const ModelContext& m, text::ChatRequest* chat, parsers::ParseOptions* parse,
                 bool* forced) {
  const bool has_tools = chat->tools.is_array() && !chat->tools.empty();
  std::string choice = "auto", named;
  if (const json* tc = f.get("tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        bad("tool_choice", fmt::format("tool_choice {} is not supported: \"auto\", \"none\", \"required\" or "
                                       "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", tc->dump()));
    } else if (tc->is_object()) {
      Fields tf(*tc, "tool_choice.");
      const json* fn = tf.get("function");
      if (tf.string("type") != "function" || !fn || !fn->is_object() || !fn->contains("name") ||
          !(*fn)["name"].is_string())
        bad("tool_choice", "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
      choice = "named";
      named = (*fn)["name"].get<std::string>();
    } else {
      Fields::wrong_type("tool_choice", "a string or an object", *tc);
    }
  }
  if (choice == "none") {
    chat->tools = json();  // the model is not offered the tools at all
    return;
  }
  if (choice == "required" || choice == "named") {
    if (!has_tools) bad("tool_choice", fmt::format("tool_choice {} needs 'tools'", (*f.get("tool_choice")).dump()));
    if (m.parsers.tools == parsers::ToolCallKind::none)
      bad("tool_choice", fmt::format("tool_choice {} needs a tool-call parser: this server reads no tool calls "
                                     "(start it with --tool-call-parser)", (*f.get("tool_choice")).dump()));
    if (choice == "named") {
      const auto names = tool_names(chat->tools);
      if (std::find(names.begin(), names.end(), named) == names.end())
        bad("tool_choice", fmt::format("tool_choice names the function '{}', which is not in 'tools'", named));
    }
  }
  if (!has_tools) return;  // nothing to call: tool-call markup stays text
  *forced = choice == "required" || choice == "named";
  parse->tools = m.parsers.tools;
  parse->tool_list = chat->tools;
  parse->only_name = named;
}

std::vector<int32_t> chat_prompt(const Fields& f, const ModelContext& m, parsers::ParseOptions* parse,
                                 bool* tools_forced) {
  text::ChatRequest chat;
  chat.messages = check_messages(f.get("messages"));
  if (const json* tools = f.get("tools")) {
    if (!tools->is_array()) Fields::wrong_type("tools", "a list of tools", *tools);
    if (tools->size() > grammar::kMaxTools)
      bad("tools", fmt::format("'tools' may list at most {} tools, got {}", grammar::kMaxTools, tools->size()));
    for (size_t i = 0; i < tools->size(); ++i)
      if (!(*tools)[i].is_object()) Fields::wrong_type(fmt::format("tools[{}]", i), "a tool object", (*tools)[i]);
    chat.tools = *tools;
  }
  tool_choice(f, m, &chat, parse, tools_forced);
  if (const json* docs = f.get("documents")) {  // RAG templates (Command-R, Granite) read them
    if (!docs->is_array()) Fields::wrong_type("documents", "a list of documents", *docs);
    chat.documents = *docs;
  }
  if (const json* kw = f.get("chat_template_kwargs")) {
    if (!kw->is_object()) Fields::wrong_type("chat_template_kwargs", "an object", *kw);
    chat.kwargs = *kw;
  }
  chat.add_generation_prompt = f.boolean("add_generation_prompt", true);
  if (!m.chat_template)
    bad("messages", fmt::format("model '{}' has no chat template: use /v1/completions, or start the server with "
                                "--chat-template", m.name));
  std::string rendered;
  try {
    rendered = m.chat_template->render(chat, m.tokenizer->special_tokens());
  } catch (const std::exception& e) {
    bad("messages", fmt::format("the chat template could not render these messages: {}", e.what()));
  }
  // Whether the template left the reply inside a think block (or closed it) decides
  // where the reply's reasoning starts (parsers/reasoning.h).
  parse->reasoning = m.parsers.reasoning;
  parse->prompt = parsers::prompt_think(rendered);
  text::EncodeOptions opt;
  opt.add_special_tokens = false;  // the template wrote BOS (if the model has one)
  opt.parse_special = true;
  try {
    return m.tokenizer->encode(rendered, opt);
  } catch (const std::exception& e) {
    bad("messages", fmt::format("the rendered chat could not be tokenized: {}", e.what()));
  }
}

// OpenAI's n: choices per request, 1..kMaxChoices. best_of (completions) may only
// repeat n: ranking more samples than are returned is not supported.
int choice_count(const Fields& f) {
  const int64_t n = f.integer("n").value_or(1);
  if (n < 1 || n > kMaxChoices) bad("n", fmt::format("'n' must be in [1, {}], got {}", kMaxChoices, n));
  if (auto b = f.integer("best_of"); b && *b != n)
    bad("best_of", fmt::format("'best_of' must equal 'n' ({}): returning the best of more samples than 'n' is not "
                               "supported, got {}", n, *b));
  return int(n);
}

void unsupported(const Fields& f) {
  if (const json* s = f.get("suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    bad("suffix", "'suffix' is not supported");
  if (const json* lb = f.get("logit_bias"); lb && !lb->empty()) bad("logit_bias", "'logit_bias' is not supported");
}

// response_format: {"type": "text"} (the default), {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"?}} (OpenAI's shapes).
// The format object of the constrained part (grammar/structural.h), or null.
std::optional<json> response_format(const Fields& f) {
  const json* rf = f.get("response_format");
  if (!rf) return std::nullopt;
  if (!rf->is_object()) Fields::wrong_type("response_format", "an object", *rf);
  Fields rff(*rf, "response_format.");
  const std::string type = rff.string("type");
  if (type.empty() || type == "text") return std::nullopt;
  if (type == "json_object") return grammar::json_object_format();
  if (type != "json_schema")
    bad("response_format", fmt::format("response_format type '{}' is not supported: \"text\", \"json_object\" or "
                                       "\"json_schema\"", type));
  const json* js = rff.get("json_schema");
  if (!js || !js->is_object())
    bad("response_format.json_schema",
        "response_format {\"type\": \"json_schema\"} needs 'json_schema': {\"name\": ..., \"schema\": {...}}");
  Fields jf(*js, "response_format.json_schema.");
  jf.string("name");          // type-checked; names the schema for the client only
  jf.boolean("strict", false);  // type-checked; every schema is enforced (as strict)
  const json* schema = jf.get("schema");
  if (!schema) bad("response_format.json_schema.schema", "response_format.json_schema needs 'schema'");
  if (!schema->is_object() && !schema->is_boolean())
    Fields::wrong_type("response_format.json_schema.schema", "a JSON Schema (an object)", *schema);
  if (const size_t n = schema->dump().size(); n > grammar::kMaxSchemaBytes)
    bad("response_format.json_schema.schema",
        fmt::format("the schema is {} bytes of JSON; at most {} are accepted", n, grammar::kMaxSchemaBytes));
  return grammar::json_schema_format(*schema);
}

// The grammar the reply must follow (response_format, or tool_choice "required" / a
// named function), compiled; null when the reply is free.
std::shared_ptr<const grammar::Grammar> output_grammar(const Fields& f, const ModelContext& m, Api api,
                                                       const parsers::ParseOptions& parse, bool tools_forced) {
  std::optional<json> body = response_format(f);
  const char* param = "response_format";
  if (tools_forced) {
    if (body)
      bad("response_format", "response_format and tool_choice \"required\" (or a named function) both constrain the "
                             "reply: send one of them");
    param = "tool_choice";
    for (const json& t : parse.tool_list)
      if (const auto fn = t.find("function"); fn != t.end() && fn->is_object())
        if (const auto ps = fn->find("parameters"); ps != fn->end() && ps->dump().size() > grammar::kMaxSchemaBytes)
          bad("tools", fmt::format("a tool's parameters are {} bytes of JSON; at most {} are accepted",
                                   ps->dump().size(), grammar::kMaxSchemaBytes));
    body = grammar::tool_call_format(parse.tools, parse.tool_list, parse.only_name);
  }
  if (!body) return nullptr;
  if (!m.grammar) bad(param, "structured outputs are not available on this server (it has no grammar engine)");
  // A chat's reasoning stays free: the grammar starts where the reasoning ends.
  const json format = api == Api::chat ? grammar::reply_format(*body, parse.reasoning, parse.prompt) : *body;
  try {
    // The constrained part alone first: a schema that admits no value (it only refers to
    // itself) is refused there, where its first token already has no way on; behind
    // free reasoning the whole reply's first token would not show it.
    std::shared_ptr<const grammar::Grammar> g = m.grammar->compile(*body);
    return format == *body ? g : m.grammar->compile(format);
  } catch (ServeError& e) {
    if (e.param.empty()) e.param = param;
    throw;
  }
}

}  // namespace

namespace {

// A request body as a JSON object, bounded in depth (ServeError 400 otherwise).
json parse_body(std::string_view body) {
  if (json_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    bad("", fmt::format("the request body nests JSON deeper than {} levels", kMaxJsonDepth));
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number too large for a double (1e400).
    // nlohmann's parser checks UTF-8 (and \u escapes) in strings, so this is also the
    // "invalid UTF-8" answer.
    bad("", fmt::format("malformed JSON in the request body: {}", e.what()));
  }
  if (!j.is_object()) bad("", fmt::format("the request body must be a JSON object, got {}", j.type_name()));
  return j;
}

// "model", when given, must name the served model (404 otherwise, as OpenAI answers).
void check_model(const Fields& f, const ModelContext& m) {
  if (const json* model = f.get("model")) {
    if (!model->is_string()) Fields::wrong_type("model", "a string", *model);
    if (*model != m.name)
      bad("model", fmt::format("The model '{}' does not exist: this server serves '{}'", model->get<std::string>(), m.name),
          404, "model_not_found");
  }
}

}  // namespace

ApiRequest parse_request(Api api, std::string_view body, const ModelContext& m) {
  const json j = parse_body(body);
  Fields f(j);
  check_model(f, m);
  unsupported(f);

  ApiRequest r;
  r.api = api;
  r.n = choice_count(f);
  RequestParams& p = r.params;
  // The cheap checks first: a bad field fails before the prompt is rendered and tokenized.
  p.sampling.temperature = f.number_in("temperature", m.defaults.temperature, 0, 2);
  p.sampling.top_p = f.number_in("top_p", m.defaults.top_p, 0, 1, /*lo_open=*/true);
  p.sampling.top_k = m.defaults.top_k;
  if (auto k = f.integer("top_k")) {
    if (*k < -1) bad("top_k", fmt::format("'top_k' must be -1 or 0 (off) or at least 1, got {}", *k));
    p.sampling.top_k = *k <= 0 ? 0 : *k;
  }
  if (const json* seed = f.get("seed")) {
    if (seed->is_number_unsigned()) p.sampling.seed = seed->get<uint64_t>();
    else p.sampling.seed = uint64_t(Fields::as_integer("seed", *seed));
  } else {
    p.sampling.seed = random_u64();  // requests without a seed differ from each other
  }
  p.presence_penalty = f.number_in("presence_penalty", 0, -2, 2);
  p.frequency_penalty = f.number_in("frequency_penalty", 0, -2, 2);
  p.ignore_eos = f.boolean("ignore_eos", false);
  p.skip_special_tokens = f.boolean("skip_special_tokens", true);
  if (const json* salt = f.get("cache_salt"); salt && !salt->is_null()) {
    if (!salt->is_string()) Fields::wrong_type("cache_salt", "a string", *salt);
    p.cache_salt = salt->get<std::string>();
    // Kept with each first block it salts: bounded so a client cannot make the
    // scheduler hold large strings (vLLM's salts are short tenant ids too).
    if (p.cache_salt.size() > 256)
      bad("cache_salt", fmt::format("'cache_salt' may have at most 256 bytes, got {}", p.cache_salt.size()));
  }

  if (const json* stop = f.get("stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      // OpenAI allows 4; more cost the engine little, but some bound keeps it cheap.
      if (stop->size() > 64) bad("stop", fmt::format("'stop' may have at most 64 strings, got {}", stop->size()));
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) Fields::wrong_type(fmt::format("stop[{}]", i), "a string", (*stop)[i]);
        p.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      Fields::wrong_type("stop", "a string or a list of strings", *stop);
    }
    std::erase_if(p.stop, [](const std::string& s) { return s.empty(); });
  }

  // Logprobs: chat has a flag plus top_logprobs (0..20), completions an integer (0..5).
  if (api == Api::chat) {
    const bool want = f.boolean("logprobs", false);
    const int64_t top = f.integer("top_logprobs").value_or(0);
    if (top < 0 || top > 20) bad("top_logprobs", fmt::format("'top_logprobs' must be in [0, 20], got {}", top));
    if (top > 0 && !want) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (want) p.top_logprobs = int(top);
  } else if (auto lp = f.integer("logprobs")) {
    if (*lp < 0 || *lp > 5) bad("logprobs", fmt::format("'logprobs' must be in [0, 5], got {}", *lp));
    p.top_logprobs = int(*lp);
  }
  r.logprobs = p.top_logprobs >= 0;
  r.echo = api == Api::completions && f.boolean("echo", false);
  if (r.echo && r.logprobs)
    bad("echo", "'echo' together with 'logprobs' is not supported: prompt logprobs are not computed");

  r.stream = f.boolean("stream", false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) Fields::wrong_type("stream_options", "an object", *so);
    Fields sf(*so, "stream_options.");
    r.include_usage = sf.boolean("include_usage", false);
  }

  const char* len_field = f.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  std::optional<int64_t> max_tokens = f.integer(len_field);
  if (max_tokens && *max_tokens < 1) bad(len_field, fmt::format("'{}' must be at least 1, got {}", len_field, *max_tokens));

  // The prompt.
  bool tools_forced = false;
  if (api == Api::chat) {
    p.prompt_ids = chat_prompt(f, m, &r.parse, &tools_forced);
    // Tags the parsers read must survive decoding: where they are special tokens, keep
    // special tokens in the text (as vLLM's Hermes and Mistral parsers do), unless the
    // request says otherwise.
    const bool tags_special = (r.parse.reasoning != parsers::ReasoningKind::none && m.parsers.think_tags_special) ||
                              (r.parse.tools != parsers::ToolCallKind::none && m.parsers.tool_markers_special);
    if (tags_special && !f.get("skip_special_tokens")) p.skip_special_tokens = false;
  } else {
    p.prompt_ids = completion_prompt(f.get("prompt"), m, &r.echo_text);
    if (!r.echo) r.echo_text.clear();
  }
  const char* prompt_field = api == Api::chat ? "messages" : "prompt";
  const int64_t P = int64_t(p.prompt_ids.size());
  r.prompt_tokens = P;
  if (P == 0) bad(prompt_field, "the prompt is empty after tokenization");

  // Length: the completion may not run past the context.
  const int64_t L = m.max_model_len;
  if (P >= L)
    bad(prompt_field,
        fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens, which leaves "
                    "no room for a completion. Please reduce the length of the prompt.", L, P),
        400, "context_length_exceeded");
  if (max_tokens && *max_tokens > L - P)
    bad(len_field,
        fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
                    "prompt, {} for the completion). Please reduce the length of the prompt or '{}'.",
                    L, P + *max_tokens, P, *max_tokens, len_field),
        400, "context_length_exceeded");
  p.max_tokens = max_tokens.value_or(L - P);
  p.grammar = output_grammar(f, m, api, r.parse, tools_forced);
  return r;
}

std::string new_response_id(Api api) {
  return fmt::format("{}{:016x}{:016x}", api == Api::chat ? "chatcmpl-" : "cmpl-", random_u64(), random_u64());
}

// vLLM's POST /tokenize: a completion prompt ("prompt", with "add_special_tokens",
// default true) or a chat ("messages", rendered as a chat request renders them, with
// "add_generation_prompt", default true), never run; the ids a request with that body
// would send to the model.
Json tokenize_response(std::string_view body, const ModelContext& m) {
  const json j = parse_body(body);
  Fields f(j);
  check_model(f, m);
  std::vector<int32_t> ids;
  if (f.get("messages")) {
    parsers::ParseOptions parse;
    bool tools_forced = false;
    ids = chat_prompt(f, m, &parse, &tools_forced);
  } else if (const json* prompt = f.get("prompt")) {
    if (!prompt->is_string()) Fields::wrong_type("prompt", "a string", *prompt);
    text::EncodeOptions opt;
    opt.add_special_tokens = f.boolean("add_special_tokens", true);
    opt.parse_special = true;
    try {
      ids = m.tokenizer->encode(prompt->get<std::string>(), opt);
    } catch (const std::exception& e) {
      bad("prompt", fmt::format("the prompt could not be tokenized: {}", e.what()));
    }
  } else {
    bad("prompt", "give 'prompt' (a string) or 'messages' (a chat)");
  }
  return {{"count", ids.size()}, {"max_model_len", m.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
}

// vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": text}, special tokens kept.
Json detokenize_response(std::string_view body, const ModelContext& m) {
  const json j = parse_body(body);
  Fields f(j);
  check_model(f, m);
  const json* tokens = f.get("tokens");
  if (!tokens) bad("tokens", "'tokens' (a list of token ids) is required");
  if (!tokens->is_array()) Fields::wrong_type("tokens", "a list of token ids", *tokens);
  const int64_t V = m.tokenizer->vocab_size();
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    const int64_t id = t.is_number_integer() ? t.get<int64_t>() : -1;
    if (!t.is_number_integer() || id < 0 || id >= V)
      bad("tokens", fmt::format("tokens[{}] must be a token id in [0, {}), got {}", i, V,
                                t.is_number_integer() ? std::to_string(id) : std::string(t.type_name())));
    ids.push_back(static_cast<int32_t>(id));
  }
  text::DecodeOptions opt;
  opt.skip_special_tokens = false;
  return {{"prompt", m.tokenizer->decode(ids, opt)}};
}

}  // namespace moe::serve
