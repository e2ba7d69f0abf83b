#include "serve/parsers/tool_formats.h"

#include <algorithm>
#include <cctype>

#include "serve/parsers/text_scan.h"

namespace moe::serve::parsers {

using Json = nlohmann::ordered_json;
using Calls = std::vector<ParsedCall>;

const std::vector<Opener>& openers(ToolCallKind kind) {
  static const std::vector<Opener> none;
  static const std::vector<Opener> hermes = {{"<tool_call>", BlockEnd::marker, "</tool_call>"}};
  // Qwen3-Coder sometimes leaves out the <tool_call> wrapper (vLLM's parser accepts a
  // bare <function=...>); a bare one must be closed by </function>.
  static const std::vector<Opener> qwen3_coder = {{"<tool_call>", BlockEnd::marker, "</tool_call>"},
                                                  {"<function=", BlockEnd::marker, "</function>"}};
  // Each call is a block of its own, so a call goes out as soon as it closes; the
  // section markers around them are framing. A reply that ends without
  // <｜tool▁calls▁end｜> (vLLM's regex does not need it either) still has its calls.
  static const std::vector<Opener> deepseek = {{"<｜tool▁calls▁begin｜>", BlockEnd::drop, ""},
                                               {"<｜tool▁calls▁end｜>", BlockEnd::drop, ""},
                                               {"<｜tool▁call▁begin｜>", BlockEnd::marker, "<｜tool▁call▁end｜>"}};
  static const std::vector<Opener> mistral = {{"[TOOL_CALLS]", BlockEnd::json, ""}};
  switch (kind) {
    case ToolCallKind::hermes: return hermes;
    case ToolCallKind::qwen3_coder: return qwen3_coder;
    case ToolCallKind::deepseek_v3:
    case ToolCallKind::deepseek_v31: return deepseek;
    case ToolCallKind::mistral: return mistral;
    case ToolCallKind::none: break;
  }
  return none;
}

namespace {

Json parse_json(std::string_view text) {
  // Invalid UTF-8 or a syntax error: discarded (null), never thrown at the caller.
  try {
    return Json::parse(text, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception&) {
    return Json::value_t::discarded;
  }
}

// A function name as the models write them: no markup, no line breaks.
bool good_name(std::string_view n) {
  return !n.empty() && n.size() <= 256 && n.find_first_of("<>\n\r{}\"") == std::string_view::npos;
}

// {"name": N, "arguments": {...}} (Qwen2.5 sometimes writes "parameters"); arguments
// sent as a JSON string are read as the object they hold.
std::optional<ParsedCall> json_call(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || !good_name(name->get<std::string>())) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  Json a = args == j.end() || args->is_null() ? Json::object() : *args;
  if (a.is_string()) a = parse_json(a.get<std::string>());
  if (!a.is_object()) return std::nullopt;
  return ParsedCall{name->get<std::string>(), std::move(a)};
}

// One call object, or a list of them.
std::optional<Calls> json_calls(const Json& j) {
  Calls calls;
  if (j.is_array()) {
    if (j.empty()) return std::nullopt;
    for (const Json& e : j) {
      auto c = json_call(e);
      if (!c) return std::nullopt;
      calls.push_back(std::move(*c));
    }
    return calls;
  }
  auto c = json_call(j);
  if (!c) return std::nullopt;
  calls.push_back(std::move(*c));
  return calls;
}

// A complete JSON value proves the call complete even without its closing tag (Hermes
// models sometimes stop right after the JSON).
std::optional<Calls> hermes(std::string_view body) { return json_calls(parse_json(trim_ws(body))); }

// The "properties" schema of tool `name` in the request's tools, or null.
const Json* properties_of(const Json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const Json& t : tools) {
    if (!t.is_object()) continue;
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) continue;
    auto n = fn->find("name");
    if (n == fn->end() || *n != name) continue;
    auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return nullptr;
    auto props = params->find("properties");
    return props != params->end() && props->is_object() ? &*props : nullptr;
  }
  return nullptr;
}

constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";

// The parameters of one Qwen3-Coder function: <parameter=P>\nvalue\n</parameter> ...
// A value ends at </parameter>, or (left open) where the next <parameter= starts or the
// function ends. Anything but whitespace between parameters: not a call.
std::optional<Json> xml_parameters(std::string_view region, const Json* props) {
  Json args = Json::object();
  size_t pos = 0;
  for (;;) {
    const size_t i = skip_ws(region, pos);
    if (i == region.size()) return args;
    if (!region.substr(i).starts_with(kParameter)) return std::nullopt;
    const size_t name_end = region.find('>', i + kParameter.size());
    if (name_end == std::string_view::npos) return std::nullopt;
    const std::string name(trim_ws(region.substr(i + kParameter.size(), name_end - i - kParameter.size())));
    if (!good_name(name)) return std::nullopt;
    const size_t v0 = name_end + 1;
    const size_t close = region.find(kParameterEnd, v0);
    const size_t next = std::min(region.find(kParameter, v0), region.size());
    size_t v1;
    if (close != std::string_view::npos && close < next) {
      v1 = close;
      pos = close + kParameterEnd.size();
    } else {
      v1 = next;
      pos = next;
    }
    // The template writes the value between newlines: one on each side is layout.
    std::string_view value = region.substr(v0, v1 - v0);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const Json* schema = nullptr;
    if (props) {
      auto it = props->find(name);
      if (it != props->end()) schema = &*it;
    }
    args[name] = typed_value(std::string(value), schema);
  }
}

// The function after "<function=" in `text`: NAME>parameters. *end: where it stopped.
std::optional<ParsedCall> xml_function(std::string_view text, const Json& tools) {
  const size_t name_end = text.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  const std::string name(trim_ws(text.substr(0, name_end)));
  if (!good_name(name)) return std::nullopt;
  auto args = xml_parameters(text.substr(name_end + 1), properties_of(tools, name));
  if (!args) return std::nullopt;
  return ParsedCall{name, std::move(*args)};
}

std::optional<Calls> qwen3_coder(const Opener& op, std::string_view body, bool terminated, const Json& tools) {
  if (op.marker == kFunction) {  // a bare <function=...>, closed by </function>
    if (!terminated) return std::nullopt;
    auto c = xml_function(body, tools);
    if (!c) return std::nullopt;
    return Calls{std::move(*c)};
  }
  // <tool_call> ... </tool_call>: one or more functions. A function left open counts
  // only when </tool_call> closed the block.
  Calls calls;
  size_t pos = 0;
  for (;;) {
    const size_t i = skip_ws(body, pos);
    if (i == body.size()) break;
    if (!body.substr(i).starts_with(kFunction)) return std::nullopt;
    const size_t start = i + kFunction.size();
    size_t end = body.find(kFunctionEnd, start);
    if (end == std::string_view::npos) {
      if (!terminated) return std::nullopt;
      end = body.size();
      pos = body.size();
    } else {
      pos = end + kFunctionEnd.size();
    }
    auto c = xml_function(body.substr(start, end - start), tools);
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

constexpr std::string_view kToolSep = "<｜tool▁sep｜>";

// V3/R1:  TYPE<｜tool▁sep｜>NAME\n```json\n{...}\n```
// V3.1:   NAME<｜tool▁sep｜>{...}
std::optional<Calls> deepseek(std::string_view body) {
  const size_t sep = body.find(kToolSep);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view head = trim_ws(body.substr(0, sep));
  std::string_view tail = trim_ws(body.substr(sep + kToolSep.size()));
  std::string name;
  if (tail.starts_with('{')) {
    name = head;
  } else {
    const size_t fence = tail.find("```");
    if (fence == std::string_view::npos || head.empty()) return std::nullopt;
    name = trim_ws(tail.substr(0, fence));
    tail = tail.substr(fence + 3);
    if (tail.starts_with("json")) tail.remove_prefix(4);
    tail = trim_ws(tail);
    if (tail.ends_with("```")) tail = trim_ws(tail.substr(0, tail.size() - 3));
  }
  if (!good_name(name)) return std::nullopt;
  Json args = parse_json(tail);
  if (!args.is_object()) return std::nullopt;
  return Calls{ParsedCall{std::move(name), std::move(args)}};
}

bool mistral_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }
constexpr std::string_view kArgs = "[ARGS]";

// Where the JSON of a Mistral block starts: after whitespace ([{...}] or {...}), or
// after NAME and an optional [ARGS]. unknown: not yet known; invalid: not a call.
struct JsonStart {
  enum Status { unknown, at, invalid };
  JsonStart(Status s, size_t p = 0, std::string_view n = {}) : status(s), pos(p), name(n) {}
  Status status;
  size_t pos;
  std::string_view name;
};
JsonStart mistral_json_start(std::string_view body) {
  size_t i = skip_ws(body);
  if (i == body.size()) return {JsonStart::unknown};
  if (body[i] == '[' || body[i] == '{') return {JsonStart::at, i};
  const size_t n0 = i;
  while (i < body.size() && mistral_name_char(body[i])) ++i;
  if (i == n0) return {JsonStart::invalid};
  const std::string_view name = body.substr(n0, i - n0);
  i = skip_ws(body, i);
  if (i == body.size()) return {JsonStart::unknown};
  const std::string_view rest = body.substr(i);
  if (rest.starts_with(kArgs)) {
    i = skip_ws(body, i + kArgs.size());
    if (i == body.size()) return {JsonStart::unknown};
  } else if (kArgs.starts_with(rest)) {
    return {JsonStart::unknown};
  }
  if (body[i] != '{') return {JsonStart::invalid};
  return {JsonStart::at, i, name};
}

std::optional<Calls> mistral(std::string_view body, bool terminated) {
  if (!terminated) return std::nullopt;
  const JsonStart s = mistral_json_start(body);
  if (s.status != JsonStart::at) return std::nullopt;
  Json j = parse_json(trim_ws(body.substr(s.pos)));
  if (s.name.empty()) return json_calls(j);
  if (!j.is_object()) return std::nullopt;
  return Calls{ParsedCall{std::string(s.name), std::move(j)}};
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

JsonExtent mistral_extent(std::string_view body) {
  const JsonStart s = mistral_json_start(body);
  if (s.status == JsonStart::unknown) return {JsonExtent::incomplete, body.size()};
  if (s.status == JsonStart::invalid) return {JsonExtent::invalid, 0};
  return json_extent(body, s.pos);
}

Json typed_value(const std::string& text, const Json* schema) {
  std::string type;
  if (schema && schema->is_object()) {
    auto t = schema->find("type");
    if (t != schema->end() && t->is_string()) {
      type = t->get<std::string>();
    } else if (t != schema->end() && t->is_array()) {  // ["integer", "null"]
      for (const Json& e : *t)
        if (e.is_string() && e != "null") {
          type = e.get<std::string>();
          break;
        }
    }
  }
  // An enum is a closed set: whitespace around one of its values is layout (a grammar-
  // constrained reply may put some there).
  if (schema && schema->is_object())
    if (auto e = schema->find("enum"); e != schema->end() && e->is_array()) {
      const Json trimmed = std::string(trim_ws(text));
      if (std::find(e->begin(), e->end(), Json(text)) == e->end() && std::find(e->begin(), e->end(), trimmed) != e->end())
        return trimmed;
    }
  // Without a schema type the text is the value: guessing would turn "007" into 7.
  if (type.empty() || type == "string") return text;
  const std::string_view trimmed = trim_ws(text);
  if (lower(trimmed) == "null") return nullptr;
  if (type == "boolean") {
    const std::string b = lower(trimmed);
    if (b == "true" || b == "false") return b == "true";
    return text;
  }
  Json v = parse_json(trimmed);
  if (type == "integer" && v.is_number_integer()) return v;
  if (type == "number" && v.is_number()) return v;
  if (type == "object" && v.is_object()) return v;
  if (type == "array" && v.is_array()) return v;
  if (type != "integer" && type != "number" && type != "object" && type != "array" && !v.is_discarded()) return v;
  return text;
}

std::optional<std::vector<ParsedCall>> parse_block(ToolCallKind kind, const Opener& opener, std::string_view body,
                                                   bool terminated, const Json& tools) {
  switch (kind) {
    case ToolCallKind::hermes: return hermes(body);
    case ToolCallKind::qwen3_coder: return qwen3_coder(opener, body, terminated, tools);
    case ToolCallKind::deepseek_v3:
    case ToolCallKind::deepseek_v31: return deepseek(body);
    case ToolCallKind::mistral: return mistral(body, terminated);
    case ToolCallKind::none: break;
  }
  return std::nullopt;
}

}  // namespace moe::serve::parsers
