// The OpenAI protocol layer without HTTP: request checking (every field, its type and
// range, the prompt forms, the context limit, chat rendering) and the response shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "fake_engine.h"
#include "serve/grammar/structural.h"
#include "serve/openai.h"

namespace moe::serve::testing {
namespace {

using json = nlohmann::ordered_json;

struct Ctx : FakeModelContext {
  Ctx() : FakeModelContext(64) {}
  ApiRequest completion(const json& body) const { return parse_request(Api::completions, body.dump(), m); }
  ApiRequest chat(const json& body) const { return parse_request(Api::chat, body.dump(), m); }
};

// The ServeError a parse throws (status 0 when it throws none).
template <typename F>
ServeError error_of(F&& f) {
  try {
    f();
  } catch (const ServeError& e) {
    return e;
  }
  return ServeError{0, "", "no error", "", ""};
}

const json kChat = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};

TEST(OpenAiParse, CompletionFieldsMapToParams) {
  Ctx c;
  ApiRequest r = c.completion({{"model", "fake-model"},
                               {"prompt", "abc"},
                               {"max_tokens", 10},
                               {"temperature", 0.7},
                               {"top_p", 0.9},
                               {"top_k", 40},
                               {"seed", 1234},
                               {"stop", {"x", "", "yz"}},
                               {"presence_penalty", 0.5},
                               {"frequency_penalty", -1.5},
                               {"ignore_eos", true},
                               {"skip_special_tokens", false},
                               {"logprobs", 3},
                               {"stream", true},
                               {"stream_options", {{"include_usage", true}}}});
  const RequestParams& p = r.params;
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{1, c.tok.ids("a")[0], c.tok.ids("b")[0], c.tok.ids("c")[0]}))
      << "completions add BOS (add_special_tokens=true)";
  EXPECT_EQ(r.prompt_tokens, 4);
  EXPECT_EQ(p.max_tokens, 10);
  EXPECT_DOUBLE_EQ(p.sampling.temperature, 0.7);
  EXPECT_DOUBLE_EQ(p.sampling.top_p, 0.9);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_EQ(p.sampling.seed, 1234u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"x", "yz"})) << "empty stop strings are dropped";
  EXPECT_DOUBLE_EQ(p.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(p.frequency_penalty, -1.5);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_FALSE(p.skip_special_tokens);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_TRUE(r.logprobs && r.stream && r.include_usage);
  EXPECT_EQ(c.completion({{"prompt", "a"}, {"stop", "END"}}).params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(c.completion({{"prompt", "a"}, {"top_k", -1}}).params.sampling.top_k, 0) << "-1 is off";
  EXPECT_EQ(c.completion({{"prompt", "a"}, {"max_tokens", 16.0}}).params.max_tokens, 16) << "16.0 is an integer";
  EXPECT_EQ(c.completion({{"prompt", "a"}, {"seed", -1}}).params.sampling.seed, ~uint64_t(0));
}

TEST(OpenAiParse, DefaultsAndNulls) {
  Ctx c;
  c.m.defaults.temperature = 0.6;
  ApiRequest r = c.completion({{"prompt", "abc"}, {"max_tokens", nullptr}, {"temperature", nullptr}, {"stop", nullptr}});
  EXPECT_EQ(r.params.max_tokens, 64 - 4) << "the rest of the context";
  EXPECT_DOUBLE_EQ(r.params.sampling.temperature, 0.6) << "the server's default (generation_config)";
  EXPECT_EQ(r.params.top_logprobs, -1);
  EXPECT_TRUE(r.params.skip_special_tokens);
  EXPECT_FALSE(r.params.ignore_eos || r.stream || r.include_usage || r.logprobs || r.echo);
  // No seed: each request gets its own.
  std::set<uint64_t> seeds;
  for (int i = 0; i < 8; ++i) seeds.insert(c.completion({{"prompt", "a"}}).params.sampling.seed);
  EXPECT_EQ(seeds.size(), 8u);
  // max_completion_tokens wins over max_tokens.
  EXPECT_EQ(c.chat({{"messages", kChat["messages"]}, {"max_tokens", 3}, {"max_completion_tokens", 5}}).params.max_tokens, 5);
}

TEST(OpenAiParse, WrongTypesNameTheField) {
  Ctx c;
  const std::vector<std::pair<std::string, json>> cases = {
      {"model", 3},          {"max_tokens", "16"},  {"max_tokens", 1.5},     {"temperature", "hot"},
      {"top_p", true},       {"top_k", 2.5},        {"seed", "s"},           {"stop", 5},
      {"stop", {"a", 1}},    {"n", "1"},            {"logprobs", 1},         {"top_logprobs", "2"},
      {"presence_penalty", "x"}, {"frequency_penalty", json::array()}, {"ignore_eos", 1}, {"stream", "yes"},
      {"stream_options", true}, {"stream_options", {{"include_usage", 1}}}, {"tools", {{"type", "function"}}},
      {"tools", json::array({1})}, {"tool_choice", 7}, {"chat_template_kwargs", "x"},
      {"add_generation_prompt", "no"}, {"skip_special_tokens", 0}, {"messages", "hi"},
      {"messages", json::array({"hi"})}, {"messages", json::array({{{"role", 1}}})},
      {"messages", json::array({{{"role", "user"}, {"content", 5}}})},
      {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})},
      {"messages", json::array({{{"role", "user"}, {"content", "x"}, {"name", 3}}})},
      {"messages", json::array({{{"role", "assistant"}, {"tool_calls", "x"}}})},
  };
  for (const auto& [field, value] : cases) {
    json body = kChat;
    body[field] = value;
    ServeError e = error_of([&] { c.chat(body); });
    EXPECT_EQ(e.status, 400) << field << " = " << value.dump();
    EXPECT_EQ(e.param.substr(0, field.size()), field) << value.dump() << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"prompt", 5}, {"prompt", {1, "a"}}, {"prompt", json::array({1.5})}, {"echo", "yes"}, {"logprobs", true}}) {
    json body = {{"prompt", "abc"}};
    body[field] = value;
    ServeError e = error_of([&] { c.completion(body); });
    EXPECT_EQ(e.status, 400) << field << " = " << value.dump();
    EXPECT_EQ(e.param.substr(0, field.size()), field) << value.dump() << ": " << e.message;
  }
}

TEST(OpenAiParse, RangesAreChecked) {
  Ctx c;
  const std::vector<std::pair<std::string, json>> bad = {
      {"temperature", -0.1}, {"temperature", 2.5}, {"top_p", 0},        {"top_p", 1.01},
      {"top_k", -2},         {"max_tokens", 0},    {"presence_penalty", 2.1}, {"frequency_penalty", -3},
      {"top_logprobs", 21},  {"n", 9},             {"n", 0},          {"max_completion_tokens", -5}};
  for (const auto& [field, value] : bad) {
    json body = kChat;
    body[field] = value;
    if (field == "top_logprobs") body["logprobs"] = true;
    ServeError e = error_of([&] { c.chat(body); });
    EXPECT_EQ(e.status, 400) << field << " = " << value;
    EXPECT_EQ(e.param, field) << e.message;
  }
  EXPECT_EQ(error_of([&] { c.completion({{"prompt", "a"}, {"logprobs", 6}}); }).param, "logprobs");
  ServeError n9 = error_of([&] { c.completion({{"prompt", "a"}, {"n", 9}}); });
  EXPECT_NE(n9.message.find("[1, 8], got 9"), std::string::npos) << n9.message;
  EXPECT_EQ(c.completion({{"prompt", "a"}, {"n", 8}}).n, 8);
  EXPECT_EQ(c.completion({{"prompt", "a"}, {"n", 3}, {"best_of", 3}}).n, 3) << "best_of may repeat n";
  EXPECT_EQ(c.chat({{"messages", kChat["messages"]}}).n, 1);
  ServeError best = error_of([&] { c.completion({{"prompt", "a"}, {"n", 2}, {"best_of", 4}}); });
  EXPECT_EQ(best.param, "best_of");
  EXPECT_NE(best.message.find("must equal 'n' (2)"), std::string::npos) << best.message;
  EXPECT_EQ(error_of([&] { c.chat({{"messages", kChat["messages"]}, {"top_logprobs", 2}}); }).param, "top_logprobs")
      << "top_logprobs needs logprobs: true";
  // The edges are allowed.
  c.chat({{"messages", kChat["messages"]}, {"temperature", 0}, {"top_p", 1}, {"top_k", 0},
          {"logprobs", true}, {"top_logprobs", 20}, {"presence_penalty", -2}, {"n", 1}});
  c.chat({{"messages", kChat["messages"]}, {"temperature", 2}});
}

TEST(OpenAiParse, UnknownFieldsAreIgnored) {
  Ctx c;
  ApiRequest r = c.chat({{"messages", kChat["messages"]}, {"user", "u1"}, {"metadata", {{"a", 1}}}, {"foo", {1, 2}},
                         {"repetition_penalty", 1.1}, {"parallel_tool_calls", true}});
  EXPECT_FALSE(r.params.prompt_ids.empty());
}

TEST(OpenAiParse, PromptForms) {
  Ctx c;
  const int32_t a = c.tok.ids("a")[0];
  EXPECT_EQ(c.completion({{"prompt", {a, a}}}).params.prompt_ids, (std::vector<int32_t>{a, a})) << "ids as given, no BOS";
  EXPECT_EQ(c.completion({{"prompt", json::array({"a"})}}).params.prompt_ids, (std::vector<int32_t>{1, a})) << "one string in a list";
  EXPECT_EQ(c.completion({{"prompt", json::array({json::array({a})})}}).params.prompt_ids, (std::vector<int32_t>{a})) << "one id list in a list";
  EXPECT_EQ(c.completion({{"prompt", "<|im_start|>a"}}).params.prompt_ids, (std::vector<int32_t>{1, 3, a}))
      << "special token strings are parsed (as vLLM)";
  ServeError batch = error_of([&] { c.completion({{"prompt", {"a", "b"}}}); });
  EXPECT_EQ(batch.status, 400);
  EXPECT_NE(batch.message.find("batched"), std::string::npos) << batch.message;
  EXPECT_EQ(error_of([&] { c.completion({{"prompt", json::array({json::array({1}), json::array({2})})}}); }).status, 400);
  EXPECT_EQ(error_of([&] { c.completion({{"prompt", json::array()}}); }).param, "prompt") << "empty after tokenization";
  EXPECT_EQ(error_of([&] { c.completion({{"prompt", {5, 261}}}); }).param, "prompt") << "id out of vocab";
  EXPECT_EQ(error_of([&] { c.completion({{"prompt", json::array({-1})}}); }).status, 400);
  EXPECT_EQ(error_of([&] { c.completion(json::object()); }).param, "prompt");
  // Echo returns the prompt text first; with logprobs it is refused (no prompt logprobs).
  ApiRequest e = c.completion({{"prompt", "abc"}, {"echo", true}});
  EXPECT_TRUE(e.echo);
  EXPECT_EQ(e.echo_text, "abc");
  EXPECT_EQ(error_of([&] { c.completion({{"prompt", "a"}, {"echo", true}, {"logprobs", 1}}); }).param, "echo");
}

TEST(OpenAiParse, ContextLength) {
  Ctx c;  // max_model_len 64
  const std::string p60(59, 'x');  // + BOS = 60 tokens
  EXPECT_EQ(c.completion({{"prompt", p60}}).params.max_tokens, 4);
  EXPECT_EQ(c.completion({{"prompt", p60}, {"max_tokens", 4}}).params.max_tokens, 4);
  ServeError e = error_of([&] { c.completion({{"prompt", p60}, {"max_tokens", 5}}); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(e.message.find("maximum context length is 64 tokens"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("65"), std::string::npos) << e.message;
  ServeError full = error_of([&] { c.completion({{"prompt", std::string(63, 'x')}}); });
  EXPECT_EQ(full.status, 400) << "64 prompt tokens leave no room";
  EXPECT_EQ(full.param, "prompt");
}

TEST(OpenAiParse, ModelMustBeTheServedOne) {
  Ctx c;
  ServeError e = error_of([&] { c.completion({{"model", "gpt-4"}, {"prompt", "a"}}); });
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_NE(e.message.find("gpt-4"), std::string::npos);
  c.completion({{"prompt", "a"}});  // no model: the served one
}

TEST(OpenAiParse, MalformedBodies) {
  Ctx c;
  for (const std::string& body : {std::string("{\"prompt\": \"a\""), std::string("{prompt: 1}"), std::string(""),
                                 std::string("{\"prompt\": \"\xff\xfe\"}"),  // invalid UTF-8
                                 std::string("{\"prompt\": \"\\ud800\"}"),   // a lone surrogate
                                 std::string("[1, 2]"), std::string("\"text\""), std::string(200, '['),
                                 std::string("{\"prompt\": [1e400]}")}) {  // a number no double holds (the fuzzer's)
    ServeError e = error_of([&] { parse_request(Api::completions, body, c.m); });
    EXPECT_EQ(e.status, 400) << body.substr(0, 40);
    EXPECT_FALSE(e.message.empty());
    // The message is valid JSON text even when the body was not UTF-8.
    EXPECT_NO_THROW(json::parse(dump_json(error_json(e))));
  }
  EXPECT_NE(error_of([&] { parse_request(Api::completions, "{\"prompt\": \"\xc3\x28\"}", c.m); }).message.find("UTF-8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_request(Api::completions, std::string(100, '[') + std::string(100, ']'), c.m); })
                .message.find("deeper"),
            std::string::npos);
}

TEST(OpenAiParse, UnsupportedFeaturesSaySo) {
  Ctx c;
  const std::vector<std::pair<std::string, json>> cases = {
      {"best_of", 2},
      {"tool_choice", "required"},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}},
      {"logit_bias", {{"12", 5}}},
      {"response_format", {{"type", "regex"}}},
      {"suffix", "tail"}};
  for (const auto& [field, value] : cases) {
    json body = kChat;
    body[field] = value;
    ServeError e = error_of([&] { c.chat(body); });
    EXPECT_EQ(e.status, 400) << field;
    EXPECT_EQ(e.param, field) << e.message;
  }
  c.chat({{"messages", kChat["messages"]}, {"tool_choice", "auto"}, {"response_format", {{"type", "text"}}},
          {"logit_bias", json::object()}});
}

// Structured outputs: which grammar a request asks for (the compiler records the formats;
// tests/test_serve_grammar.cpp runs them in xgrammar), and every malformed shape a 400
// naming its field.
TEST(OpenAiParse, ResponseFormatAndForcedToolsBecomeGrammars) {
  Ctx c;
  c.m.max_model_len = 4096;
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}};
  auto formats_after = [&](auto&& f) {
    const size_t before = c.grammar.formats().size();
    f();
    const auto all = c.grammar.formats();
    return std::vector<json>(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
  };
  // No response_format (or "text"): no grammar, nothing compiled.
  EXPECT_TRUE(formats_after([&] { EXPECT_EQ(c.chat(kChat).params.grammar, nullptr); }).empty());
  json body = kChat;
  body["response_format"] = {{"type", "json_object"}};
  auto f = formats_after([&] { EXPECT_NE(c.chat(body).params.grammar, nullptr); });
  EXPECT_EQ(f, std::vector<json>{grammar::json_object_format()});
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}, {"strict", true}}}};
  f = formats_after([&] { c.chat(body); });
  EXPECT_EQ(f, std::vector<json>{grammar::json_schema_format(schema)});
  // Completions take it too (no template, no reasoning).
  f = formats_after([&] { c.completion({{"prompt", "Hi"}, {"response_format", {{"type", "json_object"}}}}); });
  EXPECT_EQ(f, std::vector<json>{grammar::json_object_format()});
  // With a reasoning parser the constrained part is compiled alone (to refuse an empty
  // language), then the whole reply with free reasoning before it.
  c.m.parsers.reasoning = parsers::ReasoningKind::qwen3;
  f = formats_after([&] { c.chat(body); });
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0], grammar::json_schema_format(schema));
  EXPECT_EQ(f[1], grammar::reply_format(grammar::json_schema_format(schema), parsers::ReasoningKind::qwen3,
                                        parsers::PromptThink::none));
  c.m.parsers.reasoning = parsers::ReasoningKind::none;
  // tool_choice "required" / named: the call grammar of the server's format.
  c.m.parsers.tools = parsers::ToolCallKind::hermes;
  const json tools = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", schema}}}},
                      {{"type", "function"}, {"function", {{"name", "g"}}}}};
  json tb = kChat;
  tb["tools"] = tools;
  tb["tool_choice"] = "required";
  f = formats_after([&] { c.chat(tb); });
  EXPECT_EQ(f, std::vector<json>{grammar::tool_call_format(parsers::ToolCallKind::hermes, tools, "")});
  tb["tool_choice"] = {{"type", "function"}, {"function", {{"name", "g"}}}};
  f = formats_after([&] { c.chat(tb); });
  EXPECT_EQ(f, std::vector<json>{grammar::tool_call_format(parsers::ToolCallKind::hermes, tools, "g")});
  tb["tool_choice"] = "auto";  // auto stays free
  EXPECT_EQ(c.chat(tb).params.grammar, nullptr);

  // Malformed shapes.
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"type", "xml"}}, "response_format"},
      {{{"type", 3}}, "response_format.type"},
      {{{"type", "json_schema"}}, "response_format.json_schema"},
      {{{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}, "response_format.json_schema.schema"},
      {{{"type", "json_schema"}, {"json_schema", {{"schema", "{}"}}}}, "response_format.json_schema.schema"},
      {{{"type", "json_schema"}, {"json_schema", {{"schema", schema}, {"strict", "yes"}}}},
       "response_format.json_schema.strict"},
      {{{"type", "json_schema"}, {"json_schema", {{"schema", {{"description", std::string(70000, 'x')}}}}}},
       "response_format.json_schema.schema"}};
  for (const auto& [rf, param] : bad) {
    json b = kChat;
    b["response_format"] = rf;
    ServeError e = error_of([&] { c.chat(b); });
    EXPECT_EQ(e.status, 400) << rf.dump().substr(0, 100);
    EXPECT_EQ(e.param, param) << e.message;
  }
  // Both constraints at once; more tools than OpenAI allows; a server without a grammar engine.
  json both = tb;
  both["tool_choice"] = "required";
  both["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(error_of([&] { c.chat(both); }).param, "response_format");
  json many = kChat;
  many["tools"] = json::array();
  for (int i = 0; i < 1000; ++i) many["tools"].push_back({{"type", "function"}, {"function", {{"name", fmt::format("t{}", i)}}}});
  ServeError e = error_of([&] { c.chat(many); });
  EXPECT_EQ(e.param, "tools");
  EXPECT_NE(e.message.find("at most 128"), std::string::npos) << e.message;
  c.m.grammar = nullptr;
  e = error_of([&] { c.chat(body); });
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("not available"), std::string::npos) << e.message;
}

TEST(OpenAiChat, RendersTheTemplateAndParsesSpecialTokens) {
  Ctx c;
  c.m.max_model_len = 1024;  // a byte per token: chats are long
  json msgs = {{{"role", "developer"}, {"content", "Be brief."}},
               {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}, {{"type", "text"}, {"text", "there"}}}}}};
  ApiRequest r = c.chat({{"messages", msgs}});
  const std::string want =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n";
  text::EncodeOptions o;
  o.add_special_tokens = false;
  EXPECT_EQ(r.params.prompt_ids, c.tok.encode(want, o)) << "developer -> system, text parts joined by newlines";
  EXPECT_EQ(r.params.prompt_ids.front(), 3) << "<|im_start|> is one control token, and no BOS is added";

  ApiRequest nothink = c.chat({{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  EXPECT_EQ(c.tok.decode(nothink.params.prompt_ids), want + "<think>\n\n</think>\n\n");
  ApiRequest nogen = c.chat({{"messages", msgs}, {"add_generation_prompt", false}});
  EXPECT_EQ(c.tok.decode(nogen.params.prompt_ids), want.substr(0, want.size() - 22));

  ServeError role = error_of([&] { c.chat({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}); });
  EXPECT_EQ(role.param, "messages[0].role");
  EXPECT_EQ(error_of([&] { c.chat({{"messages", json::array()}}); }).param, "messages");
  EXPECT_EQ(error_of([&] { c.chat(json::object()); }).param, "messages");
  c.m.chat_template = nullptr;
  ServeError none = error_of([&] { c.chat(kChat); });
  EXPECT_EQ(none.status, 400);
  EXPECT_NE(none.message.find("no chat template"), std::string::npos) << none.message;
}

TEST(OpenAiChat, ToolCallsReachTheTemplate) {
  Ctx c;
  c.m.max_model_len = 1024;
  text::ChatTemplate t(
      "{% for m in messages %}{% if m.tool_calls %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ "
      "tc.function.arguments.city }}){% endfor %}{% else %}[{{ m.role }}:{{ m.content }}]{% endif %}{% endfor %}"
      "{% if tools %}{{ tools | length }} tools{% endif %}",
      "tools");
  c.m.chat_template = &t;
  json msgs = {{{"role", "user"}, {"content", "weather?"}},
               {{"role", "assistant"},
                {"content", nullptr},
                {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                 {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
               {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}}};
  json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}};
  ApiRequest r = c.chat({{"messages", msgs}, {"tools", tools}});
  EXPECT_EQ(c.tok.decode(r.params.prompt_ids), "[user:weather?]get_weather(Paris)[tool:sunny]1 tools")
      << "arguments given as a JSON string reach the template as a mapping";
  ApiRequest none = c.chat({{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}});
  EXPECT_EQ(c.tok.decode(none.params.prompt_ids), "[user:weather?]get_weather(Paris)[tool:sunny]")
      << "tool_choice none: the tools are not offered";
  // A template error (raise_exception) is the request's fault: 400.
  text::ChatTemplate raising("{{ raise_exception('roles must alternate') }}", "raising");
  c.m.chat_template = &raising;
  ServeError e = error_of([&] { c.chat(kChat); });
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("roles must alternate"), std::string::npos) << e.message;
}

// vLLM's /tokenize and /detokenize: the ids a generation request with the same body
// would run, and the text of ids with special tokens kept.
TEST(OpenAiTokenize, TheIdsTheGenerationRequestsRunAndBack) {
  Ctx c;
  c.m.max_model_len = 1024;
  const int32_t a = c.tok.ids("a")[0];
  json t = tokenize_response(json({{"prompt", "<|im_start|>a"}}).dump(), c.m);
  EXPECT_EQ(t["tokens"], json(c.completion({{"prompt", "<|im_start|>a"}}).params.prompt_ids));
  EXPECT_EQ(t["tokens"], json({1, 3, a}));
  EXPECT_EQ(t["count"], 3);
  EXPECT_EQ(t["max_model_len"], 1024);
  EXPECT_EQ(tokenize_response(json({{"prompt", "<|im_start|>a"}, {"add_special_tokens", false}}).dump(), c.m)["tokens"],
            json({3, a}));
  const json msgs = {{"messages", kChat["messages"]}, {"model", "fake-model"}};
  EXPECT_EQ(tokenize_response(msgs.dump(), c.m)["tokens"], json(c.chat(msgs).params.prompt_ids));
  EXPECT_EQ(detokenize_response(json({{"tokens", {3, a}}}).dump(), c.m), json({{"prompt", "<|im_start|>a"}}));

  auto err = [&](auto f, const json& body) { return error_of([&] { f(body.dump(), c.m); }); };
  EXPECT_EQ(err(tokenize_response, json::object()).param, "prompt");
  EXPECT_EQ(err(tokenize_response, {{"prompt", 5}}).param, "prompt");
  EXPECT_EQ(err(tokenize_response, {{"prompt", "a"}, {"model", "nope"}}).status, 404);
  EXPECT_EQ(err(detokenize_response, json::object()).param, "tokens");
  EXPECT_EQ(err(detokenize_response, {{"tokens", "ab"}}).param, "tokens");
  const ServeError out = err(detokenize_response, {{"tokens", {a, 99999}}});
  EXPECT_EQ(out.status, 400);
  EXPECT_NE(out.message.find("tokens[1]"), std::string::npos) << out.message;
  EXPECT_EQ(err(detokenize_response, {{"tokens", {-1}}}).status, 400);
}

TEST(OpenAiResponse, WholeResponseShapes) {
  Ctx c;
  ApiRequest chat = c.chat({{"messages", kChat["messages"]}, {"logprobs", true}, {"top_logprobs", 1}});
  const int32_t h = c.tok.ids("h")[0], e = c.tok.ids("\xc3\xa9")[0];
  Output out{"h\xc3\xa9", {{h, -0.5f, {{h, -0.5f}}}, {e, -INFINITY, {}}}, Finish::stop, 2, /*cached_tokens=*/3};
  json j = response_json(chat, {"chatcmpl-1", 1700000000, "fake-model"}, out, c.tok);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", "h\xc3\xa9"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", chat.prompt_tokens}, {"completion_tokens", 2},
                              {"total_tokens", chat.prompt_tokens + 2},
                              {"prompt_tokens_details", {{"cached_tokens", 3}}}}));
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  const json top = {{"token", "h"}, {"logprob", -0.5}, {"bytes", json::array({104})}};
  EXPECT_EQ(lp[0], json({{"token", "h"}, {"logprob", -0.5}, {"bytes", json::array({104})},
                         {"top_logprobs", json::array({top})}}));
  EXPECT_EQ(lp[1]["logprob"], -9999.0) << "-inf is not JSON";
  EXPECT_EQ(lp[1]["token"], "\xef\xbf\xbd") << "half a character decodes to U+FFFD";

  ApiRequest cmpl = c.completion({{"prompt", "ab"}, {"logprobs", 1}});
  json k = response_json(cmpl, {"cmpl-1", 1, "fake-model"}, {"hh", {{h, -0.25f, {{h, -0.25f}}}, {h, -1.0f, {}}}, Finish::length, 2},
                         c.tok);
  EXPECT_EQ(k["object"], "text_completion");
  EXPECT_EQ(k["choices"][0]["text"], "hh");
  EXPECT_EQ(k["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(k["choices"][0]["logprobs"], json({{"tokens", {"h", "h"}}, {"token_logprobs", {-0.25, -1.0}},
                                               {"top_logprobs", json::array({json{{"h", -0.25}}, json::object()})},
                                               {"text_offset", {0, 1}}}));
  ApiRequest plain = c.completion({{"prompt", "ab"}, {"echo", true}});
  json p = response_json(plain, {"cmpl-2", 1, "fake-model"}, {"hh", {}, Finish::length, 2}, c.tok);
  EXPECT_EQ(p["choices"][0]["text"], "abhh") << "echo";
  EXPECT_TRUE(p["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponse, ChunkSequence) {
  Ctx c;
  ApiRequest r = c.chat({{"messages", kChat["messages"]}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ChunkWriter w(r, {"chatcmpl-9", 5, "fake-model"}, c.tok);
  std::string all = w.start() + w.delta({"He", {}}) + w.delta({"", {}}) + w.delta({"llo", {}}) + w.end(Finish::length, 3, 4);
  std::vector<json> ev;
  size_t pos = 0;
  for (size_t end; (end = all.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    ASSERT_EQ(all.compare(pos, 6, "data: "), 0);
    const std::string payload = all.substr(pos + 6, end - pos - 6);
    ev.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
  }
  EXPECT_EQ(pos, all.size());
  ASSERT_EQ(ev.size(), 6u) << all;
  EXPECT_EQ(ev[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(ev[1]["choices"][0]["delta"]["content"], "He");
  EXPECT_EQ(ev[2]["choices"][0]["delta"]["content"], "llo");
  EXPECT_TRUE(ev[2]["usage"].is_null()) << "include_usage: null usage on every chunk but the last";
  EXPECT_EQ(ev[3]["choices"][0]["delta"], json::object());
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[4]["choices"], json::array());
  EXPECT_EQ(ev[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(ev[5], "[DONE]");
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ev[i]["id"], "chatcmpl-9");
    EXPECT_EQ(ev[i]["object"], "chat.completion.chunk");
  }
  std::string err = w.error(ServeError{503, "server_error", "engine died", "", ""});
  EXPECT_EQ(err, "data: {\"error\":{\"message\":\"engine died\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"
                 "\n\ndata: [DONE]\n\n");
}

// n choices: one entry per choice in order, usage over all of them with the prompt and
// its cached tokens counted once.
TEST(OpenAiResponse, ChoicesInOrderAndUsageCountsThePromptOnce) {
  Ctx c;
  ApiRequest chat = c.chat({{"messages", kChat["messages"]}, {"n", 3}});
  ASSERT_EQ(chat.n, 3);
  std::vector<Output> outs = {{"a", {}, Finish::stop, 1, 5}, {"bb", {}, Finish::length, 2, 0}, {"ccc", {}, Finish::length, 3, 0}};
  json j = response_json(chat, {"chatcmpl-3", 1, "fake-model"}, outs, c.tok);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], outs[i].text);
    EXPECT_EQ(j["choices"][i]["finish_reason"], i == 0 ? "stop" : "length");
  }
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", chat.prompt_tokens}, {"completion_tokens", 6},
                              {"total_tokens", chat.prompt_tokens + 6},
                              {"prompt_tokens_details", {{"cached_tokens", 5}}}}));
}

// A stream of n choices: every chunk names its choice, each choice gets its role chunk
// and one finish chunk, and the usage chunk and [DONE] come once, at the end.
TEST(OpenAiResponse, ChunksOfSeveralChoicesCarryTheirIndex) {
  Ctx c;
  ApiRequest r = c.completion({{"prompt", "ab"}, {"n", 2}, {"echo", true}, {"stream", true},
                               {"stream_options", {{"include_usage", true}}}});
  ChunkWriter w(r, {"cmpl-7", 5, "fake-model"}, c.tok);
  std::string all = w.start() + w.delta({"x", {}}, 1) + w.delta({"y", {}}, 0) + w.finish(Finish::length, 1) +
                    w.delta({"z", {}}, 0) + w.finish(Finish::stop, 0) + w.done(3, 1);
  std::vector<json> ev;
  size_t pos = 0;
  for (size_t end; (end = all.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    const std::string payload = all.substr(pos + 6, end - pos - 6);
    ev.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
  }
  ASSERT_EQ(ev.size(), 9u) << all;
  const std::vector<std::pair<int, std::string>> texts = {{0, "ab"}, {1, "ab"}, {1, "x"}, {0, "y"}, {1, ""}, {0, "z"}, {0, ""}};
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_EQ(ev[i]["choices"].size(), 1u) << i;
    EXPECT_EQ(ev[i]["choices"][0]["index"], texts[i].first) << i;
    EXPECT_EQ(ev[i]["choices"][0]["text"], texts[i].second) << i;
  }
  EXPECT_EQ(ev[4]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[6]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ev[7]["choices"], json::array());
  EXPECT_EQ(ev[7]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[7]["usage"]["prompt_tokens"], r.prompt_tokens);
  EXPECT_EQ(ev[8], "[DONE]");
}

}  // namespace
}  // namespace moe::serve::testing
