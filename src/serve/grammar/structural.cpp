#include "serve/grammar/structural.h"

#include <fmt/format.h>

#include "serve/engine.h"

namespace moe::serve::grammar {

namespace {

Json const_string(const std::string& s) { return Json{{"type", "const_string"}, {"value", s}}; }

Json tag(const std::string& begin, Json content, const std::string& end) {
  return Json{{"type", "tag"}, {"begin", begin}, {"content", std::move(content)}, {"end", end}};
}

Json sequence(std::vector<Json> elements) { return Json{{"type", "sequence"}, {"elements", std::move(elements)}}; }

// The whitespace a model writes between </think> and its answer (Qwen3: "\n\n"); bounded,
// so the grammar cannot be held in whitespace forever.
Json gap() { return Json{{"type", "regex"}, {"pattern", "[ \\t\\r\\n]{0,8}"}}; }

// A tool's arguments: its parameters schema, or any object when it gives none (OpenAI
// allows a function without parameters).
Json arguments_format(const Json& function, parsers::ToolCallKind kind) {
  Json schema = Json{{"type", "object"}};
  if (auto p = function.find("parameters"); p != function.end() && p->is_object()) schema = *p;
  Json f = json_schema_format(schema);
  if (kind == parsers::ToolCallKind::qwen3_coder) f["style"] = "qwen_xml";
  return f;
}

// One call of `name` in the format's own shape (parsers/tool_formats.h).
Json call_tag(parsers::ToolCallKind kind, const std::string& name, Json args) {
  using K = parsers::ToolCallKind;
  const std::string quoted = Json(name).dump();  // the name as a JSON string
  switch (kind) {
    case K::hermes:
      return tag("<tool_call>\n{\"name\": " + quoted + ", \"arguments\": ", std::move(args), "}\n</tool_call>");
    case K::qwen3_coder:
      return tag("<tool_call>\n<function=" + name + ">\n", std::move(args), "\n</function>\n</tool_call>");
    case K::deepseek_v3:
      return tag("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n", std::move(args),
                 "\n```<｜tool▁call▁end｜>");
    case K::deepseek_v31:
      return tag("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>", std::move(args), "<｜tool▁call▁end｜>");
    case K::mistral:
      return tag("{\"name\": " + quoted + ", \"arguments\": ", std::move(args), "}");
    case K::none:
      break;
  }
  throw ServeError(400, "invalid_request_error", "tool_choice needs a tool-call format", "tool_choice");
}

}  // namespace

Json json_object_format() { return json_schema_format(Json{{"type", "object"}}); }

namespace {

// xgrammar 0.2.8 compiles a string's minLength/maxLength to a character class that lets
// raw control characters (U+0000-U+001F but \r and \n) into the string, which JSON
// forbids: a reply would not parse. The same bounds as a pattern (^.{min,max}$, "."
// being a JSON string character there) keep the output valid. A string that already has
// a pattern or format keeps its schema (xgrammar ignores the bounds next to those).
void bounded_strings_as_patterns(Json& s) {
  if (s.is_array()) {
    for (Json& x : s) bounded_strings_as_patterns(x);
    return;
  }
  if (!s.is_object()) return;
  for (auto it = s.begin(); it != s.end(); ++it) bounded_strings_as_patterns(it.value());
  const auto type = s.find("type");
  if (type == s.end() || *type != "string" || s.contains("pattern") || s.contains("format")) return;
  const auto lo = s.find("minLength"), hi = s.find("maxLength");
  const bool has_lo = lo != s.end() && lo->is_number_unsigned(), has_hi = hi != s.end() && hi->is_number_unsigned();
  if (!has_lo && !has_hi) return;
  const uint64_t min = has_lo ? lo->get<uint64_t>() : 0;
  s["pattern"] = has_hi ? fmt::format("^.{{{},{}}}$", min, hi->get<uint64_t>()) : fmt::format("^.{{{},}}$", min);
  s.erase("minLength");
  s.erase("maxLength");
}

}  // namespace

Json json_schema_format(const Json& schema) {
  Json s = schema;
  bounded_strings_as_patterns(s);
  return Json{{"type", "json_schema"}, {"json_schema", std::move(s)}, {"max_whitespace_cnt", kMaxWhitespace}};
}

Json tool_call_format(parsers::ToolCallKind kind, const Json& tools, const std::string& only_name) {
  using K = parsers::ToolCallKind;
  std::vector<Json> tags;
  for (const Json& t : tools) {
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) continue;
    auto n = fn->find("name");
    if (n == fn->end() || !n->is_string()) continue;
    const std::string name = n->get<std::string>();
    if (!only_name.empty() && name != only_name) continue;
    tags.push_back(call_tag(kind, name, arguments_format(*fn, kind)));
    if (!only_name.empty()) break;  // a named choice is exactly one call of the first tool of that name
  }
  if (tags.empty())
    throw ServeError(400, "invalid_request_error",
                     only_name.empty() ? "tool_choice \"required\" needs at least one function in 'tools'"
                                       : fmt::format("tool_choice names the function '{}', which is not in 'tools'", only_name),
                     "tool_choice");
  // One call (named) or one or more (required), and nothing else.
  Json calls;
  if (!only_name.empty()) {
    calls = tags.front();
  } else {
    const char* sep = kind == K::mistral ? ", " : (kind == K::deepseek_v31 ? "" : "\n");
    calls = Json{{"type", "tags_with_separator"}, {"tags", tags}, {"separator", sep}, {"at_least_one", true}};
  }
  switch (kind) {
    case K::deepseek_v3:
    case K::deepseek_v31:
      return sequence({const_string("<｜tool▁calls▁begin｜>"), std::move(calls), const_string("<｜tool▁calls▁end｜>")});
    case K::mistral:
      return sequence({const_string("[TOOL_CALLS]["), std::move(calls), const_string("]")});
    default:
      return calls;
  }
}

Json reply_format(const Json& body, parsers::ReasoningKind reasoning, parsers::PromptThink prompt) {
  using R = parsers::ReasoningKind;
  using P = parsers::PromptThink;
  if (reasoning == R::none || prompt == P::closed) return body;
  const Json any_text = Json{{"type", "any_text"}};
  // The reply starts inside the reasoning (the prompt opened <think>; deepseek_r1 also
  // when it did not, as its parser reads such a reply): free text up to </think>.
  if (prompt == P::open || reasoning == R::deepseek_r1) return sequence({tag("", any_text, "</think>"), gap(), body});
  // qwen3 after a prompt without a think block: the reply may open one.
  return sequence({Json{{"type", "optional"}, {"content", tag("<think>", any_text, "</think>")}}, gap(), body});
}

Json structural_tag(const Json& format) { return Json{{"type", "structural_tag"}, {"format", format}}; }

}  // namespace moe::serve::grammar
