// The parsed replies on the wire: the chat.completion bodies and SSE chunks that
// src/serve/openai.cpp builds from a reply with reasoning and tool calls.
//
// The reference is the official `openai` Python client. The fixture models emit random
// text, and the engine has no way to inject a reply, so this checks the parser +
// response-builder layer against golden JSON: tests/fixtures/serve_parsers/*.json were
// written by this test (MOE_UPDATE_SERVE_PARSER_GOLDENS=1) and validated once with the
// client's own pydantic models and its stream reassembler (ChatCompletion.model_validate,
// ChatCompletionChunk.model_validate, ChatCompletionStreamState) by
// `tools/check_openai_client.py goldens`; here the builder must produce exactly those
// documents. test_serve_parsers_http.cpp runs the same layer behind the real HTTP server.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "serve/http_test_util.h"
#include "serve/openai.h"

namespace moe::serve::testing {
namespace {

using parsers::ParseOptions;
using parsers::PromptThink;
using parsers::ReasoningKind;
using parsers::ToolCallKind;

const std::string kGoldenDir = std::string(MOE_FIXTURES_DIR) + "/serve_parsers";

parsers::IdSource counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_golden" + std::to_string((*n)++); };
}

// A reply cut into pieces as the engine would send them: every 7 bytes, moved forward
// to a UTF-8 character boundary (the engine never splits a character).
std::vector<std::string> pieces_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t at = 0; at < s.size();) {
    size_t end = std::min(s.size(), at + 7);
    while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
    out.push_back(s.substr(at, end - at));
    at = end;
  }
  return out;
}

struct GoldenCase {
  std::string name;
  ParseOptions parse;
  std::string output;
  Finish finish = Finish::stop;
  bool include_usage = false;
};

std::vector<GoldenCase> golden_cases() {
  const json weather = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  std::vector<GoldenCase> c;
  auto add = [&](std::string name, ReasoningKind r, PromptThink p, ToolCallKind t, std::string out,
                 Finish f = Finish::stop, bool usage = false) {
    GoldenCase g{std::move(name), {}, std::move(out), f, usage};
    g.parse.reasoning = r;
    g.parse.prompt = p;
    g.parse.tools = t;
    if (t != ToolCallKind::none) g.parse.tool_list = weather;
    c.push_back(std::move(g));
  };
  add("qwen3_reasoning", ReasoningKind::qwen3, PromptThink::none, ToolCallKind::none,
      "<think>\nThe user says hi.\n</think>\n\nHello! How can I help?", Finish::stop, true);
  add("r1_truncated_reasoning", ReasoningKind::deepseek_r1, PromptThink::open, ToolCallKind::none,
      "\nFirst, 2+2 is", Finish::length);
  add("hermes_two_calls", ReasoningKind::qwen3, PromptThink::none, ToolCallKind::hermes,
      "<think>\nTwo cities.\n</think>\n\nChecking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"東京\"}}\n</tool_call>");
  add("qwen3_coder_call", ReasoningKind::none, PromptThink::none, ToolCallKind::qwen3_coder,
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>");
  add("deepseek_v31_call", ReasoningKind::deepseek_r1, PromptThink::open, ToolCallKind::deepseek_v31,
      "Need weather.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
      "\"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  add("mistral_call", ReasoningKind::none, PromptThink::none, ToolCallKind::mistral,
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}]");
  add("broken_call_is_content", ReasoningKind::none, PromptThink::none, ToolCallKind::hermes,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>");
  return c;
}

// The response body and the stream's chunks for one case, as the server builds them.
json build(const GoldenCase& g) {
  FakeTokenizer tok;
  ApiRequest req;
  req.api = Api::chat;
  req.prompt_tokens = 11;
  req.include_usage = g.include_usage;
  req.parse = g.parse;
  const ResponseMeta meta{"chatcmpl-golden", 1700000000, "moe-test"};
  const std::vector<std::string> pieces = pieces_of(g.output);
  Output out;
  out.text = g.output;
  out.finish = g.finish;
  out.completion_tokens = int64_t(pieces.size());
  const json whole = response_json(req, meta, out, tok, counter_ids());

  ChunkWriter w(req, meta, tok, counter_ids());
  std::string sse = w.start();
  for (const std::string& p : pieces) sse += w.delta(Delta{p, {}});
  sse += w.end(g.finish, out.completion_tokens);
  std::string framing;
  const std::vector<std::string> events = sse_payloads(sse, &framing);
  EXPECT_EQ(framing, "") << g.name;
  EXPECT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]") << g.name;
  json chunks = json::array();
  for (size_t i = 0; i + 1 < events.size(); ++i) chunks.push_back(json::parse(events[i]));
  return {{"case", g.name}, {"model_output", g.output}, {"response", whole}, {"stream", chunks}};
}

TEST(ServeParsersWire, ResponsesEqualTheClientValidatedGoldens) {
  const bool update = std::getenv("MOE_UPDATE_SERVE_PARSER_GOLDENS") != nullptr;
  for (const GoldenCase& g : golden_cases()) {
    const json got = build(g);
    const std::string path = kGoldenDir + "/" + g.name + ".json";
    if (update) {
      std::ofstream(path) << got.dump(2, ' ', false) << "\n";
      continue;
    }
    std::ifstream f(path);
    ASSERT_TRUE(f) << "missing golden " << path << " (write it with MOE_UPDATE_SERVE_PARSER_GOLDENS=1, then validate "
                   << "it with tools/check_openai_client.py goldens)";
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_EQ(got, json::parse(ss.str())) << g.name << ":\n" << got.dump(2);
  }
}

// --- requests: what the parsers are asked to do -----------------------------------

struct Ctx : FakeModelContext {
  Ctx() : FakeModelContext(4096) {
    m.parsers.reasoning = ReasoningKind::qwen3;
    m.parsers.tools = ToolCallKind::hermes;
  }
  ApiRequest chat(json body) const {
    body["messages"] = json::array({{{"role", "user"}, {"content", "Hi"}}});
    return parse_request(Api::chat, body.dump(), m);
  }
};

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");

ServeError error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ServeError& e) {
    return e;
  }
  return ServeError{0};
}

TEST(ServeParsersWire, ToolChoiceDecidesWhatIsParsed) {
  Ctx c;
  EXPECT_EQ(c.chat({{"tools", kTools}}).parse.tools, ToolCallKind::hermes);  // auto by default
  EXPECT_EQ(c.chat({}).parse.tools, ToolCallKind::none);                     // no tools: markup is text
  EXPECT_EQ(c.chat({{"tools", kTools}, {"tool_choice", "none"}}).parse.tools, ToolCallKind::none);
  EXPECT_EQ(c.chat({{"tools", kTools}, {"tool_choice", "required"}}).parse.tools, ToolCallKind::hermes);
  ApiRequest named = c.chat({{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}});
  EXPECT_EQ(named.parse.only_name, "f");
  EXPECT_EQ(named.parse.reasoning, ReasoningKind::qwen3);
  for (const json& tc : {json("required"), json("sometimes"), json(7),
                         json({{"type", "function"}, {"function", {{"name", "g"}}}}), json({{"type", "function"}})}) {
    json body = {{"tool_choice", tc}};
    if (tc != "required") body["tools"] = kTools;  // required without tools, the others with
    ServeError e = error_of([&] { c.chat(body); });
    EXPECT_EQ(e.status, 400) << tc.dump();
    EXPECT_EQ(e.param, "tool_choice") << e.message;
  }
  c.m.parsers.tools = ToolCallKind::none;  // a server without a tool-call parser cannot promise calls
  ServeError e = error_of([&] { c.chat({{"tools", kTools}, {"tool_choice", "required"}}); });
  EXPECT_NE(e.message.find("--tool-call-parser"), std::string::npos) << e.message;
}

TEST(ServeParsersWire, SpecialMarkersKeepSpecialTokensInTheText) {
  Ctx c;
  c.m.parsers.tool_markers_special = true;  // e.g. Mistral's [TOOL_CALLS]
  EXPECT_FALSE(c.chat({{"tools", kTools}}).params.skip_special_tokens);
  EXPECT_TRUE(c.chat({}).params.skip_special_tokens);  // no tools: nothing to keep
  EXPECT_TRUE(c.chat({{"tools", kTools}, {"skip_special_tokens", true}}).params.skip_special_tokens);
}

TEST(ServeParsersWire, PromptTellsWhereTheReasoningStarts) {
  Ctx c;
  EXPECT_EQ(c.chat({}).parse.prompt, PromptThink::none);
  // kChatMl writes Qwen3's empty think block for enable_thinking: false.
  EXPECT_EQ(c.chat({{"chat_template_kwargs", {{"enable_thinking", false}}}}).parse.prompt, PromptThink::closed);
}

TEST(ServeParsersWire, ReasoningInTheHistoryReachesTheTemplate) {
  // The Qwen3-style fixture template puts reasoning_content of the turn after the last
  // user message back inside <think>, as Qwen3's template does.
  std::ifstream f(std::string(MOE_FIXTURES_DIR) + "/text/templates/qwen3.jinja");
  ASSERT_TRUE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  Ctx c;
  text::ChatTemplate qwen3(ss.str(), "qwen3");
  c.m.chat_template = &qwen3;
  const json msgs = json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  ApiRequest r = parse_request(Api::chat, json({{"messages", msgs}, {"tools", kTools}}).dump(), c.m);
  const std::string prompt = c.tok.decode(r.params.prompt_ids);
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("\"arguments\": {\"a\": 1}"), std::string::npos) << prompt;
}

}  // namespace
}  // namespace moe::serve::testing
