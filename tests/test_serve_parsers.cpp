// The reply parsers of `moe-ep serve` (src/serve/parsers/): reasoning split off as
// reasoning_content, tool-call markup turned into calls, for every format, against
// goldens written here from each format's published shape (the token strings of the
// models' tokenizers and chat templates; the edge cases vLLM's and SGLang's parsers
// handle). The main property: a reply fed in any chunking (one byte at a time, random
// pieces for a fixed seed) gives exactly the events of the whole reply at once, so a
// streamed response always adds up to the non-streamed one.
#include <gtest/gtest.h>

#include <random>

#include "serve/parsers/detect.h"
#include "serve/parsers/output_parser.h"

namespace moe::serve::parsers {
namespace {

using Json = nlohmann::ordered_json;

// Ids call_0, call_1, ... so that two parses of one reply can be compared.
IdSource counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

ParseOptions reasoning_opts(ReasoningKind k, PromptThink p = PromptThink::none) {
  ParseOptions o;
  o.reasoning = k;
  o.prompt = p;
  return o;
}

ParseOptions tool_opts(ToolCallKind k, Json tools = nullptr) {
  ParseOptions o;
  o.tools = k;
  o.tool_list = std::move(tools);
  return o;
}

ParsedOutput whole(const ParseOptions& o, std::string_view text) { return parse_output(o, text, counter_ids()); }

// The same reply fed in the pieces `cuts` makes (cut positions, ascending).
ParsedOutput streamed(const ParseOptions& o, std::string_view text, const std::vector<size_t>& cuts) {
  OutputParser p(o, counter_ids());
  Events ev;
  size_t at = 0;
  for (size_t c : cuts) {
    for (Event& e : p.push(text.substr(at, c - at))) ev.push_back(std::move(e));
    at = c;
  }
  for (Event& e : p.push(text.substr(at))) ev.push_back(std::move(e));
  for (Event& e : p.finish()) ev.push_back(std::move(e));
  ParsedOutput r;
  for (Event& e : ev) {
    if (e.kind == Event::Kind::reasoning) r.reasoning = r.reasoning.value_or("") + e.text;
    if (e.kind == Event::Kind::content) r.content += e.text;
    if (e.kind == Event::Kind::tool_call) r.calls.push_back(e.call);
  }
  return r;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << what;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
  }
}

// Every byte its own piece, then 200 random chunkings: each must equal the whole parse.
void expect_chunking_invariant(const ParseOptions& o, std::string_view text) {
  const ParsedOutput ref = whole(o, text);
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  expect_same(ref, streamed(o, text, every), "byte by byte: " + std::string(text));
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    const int max_piece = 1 + int(rng() % 12);
    for (size_t at = 1 + rng() % max_piece; at < text.size(); at += 1 + rng() % max_piece) cuts.push_back(at);
    expect_same(ref, streamed(o, text, cuts), "chunking " + std::to_string(trial) + ": " + std::string(text));
  }
}

Json args_of(const ToolCall& c) { return Json::parse(c.arguments); }

// --- reasoning ---------------------------------------------------------------------

TEST(ServeParsersReasoning, PromptThinkState) {
  EXPECT_EQ(prompt_think("<|im_start|>assistant\n<think>\n"), PromptThink::open);
  EXPECT_EQ(prompt_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"), PromptThink::closed);
  EXPECT_EQ(prompt_think("<｜Assistant｜></think>"), PromptThink::closed);
  EXPECT_EQ(prompt_think("<|im_start|>assistant\n"), PromptThink::none);
}

TEST(ServeParsersReasoning, Qwen3ThinkBlockAtTheStart) {
  auto r = whole(reasoning_opts(ReasoningKind::qwen3), "<think>\nThe user greets me.\n\nBe nice.\n</think>\n\nHello!");
  EXPECT_EQ(r.reasoning, "The user greets me.\n\nBe nice.");
  EXPECT_EQ(r.content, "Hello!");
  // No think block: the reply byte for byte, whitespace and a later <think> included.
  r = whole(reasoning_opts(ReasoningKind::qwen3), "\n Hi <think>x</think> \n");
  EXPECT_FALSE(r.reasoning);
  EXPECT_EQ(r.content, "\n Hi <think>x</think> \n");
  // An empty think block (what the model writes with thinking off in old templates).
  r = whole(reasoning_opts(ReasoningKind::qwen3), "<think>\n\n</think>\n\nJust the answer.");
  EXPECT_FALSE(r.reasoning);
  EXPECT_EQ(r.content, "Just the answer.");
}

TEST(ServeParsersReasoning, EnableThinkingFalseIsAllContent) {
  // The template closed the block in the prompt: tags in the reply are just text.
  auto r = whole(reasoning_opts(ReasoningKind::qwen3, PromptThink::closed), "<think>a</think>b");
  EXPECT_FALSE(r.reasoning);
  EXPECT_EQ(r.content, "<think>a</think>b");
}

TEST(ServeParsersReasoning, PromptOpensThinkOnlyCloseTagInReply) {
  for (ReasoningKind k : {ReasoningKind::deepseek_r1, ReasoningKind::qwen3}) {
    auto r = whole(reasoning_opts(k, PromptThink::open), "\nLet me add: 2+2=4.\n</think>\n\nThe answer is 4.");
    EXPECT_EQ(r.reasoning, "Let me add: 2+2=4.");
    EXPECT_EQ(r.content, "The answer is 4.");
    // A model that writes <think> again anyway.
    r = whole(reasoning_opts(k, PromptThink::open), "<think>\nhm\n</think>ok");
    EXPECT_EQ(r.reasoning, "hm");
    EXPECT_EQ(r.content, "ok");
  }
}

TEST(ServeParsersReasoning, TruncatedReasoningIsAllReasoning) {
  auto r = whole(reasoning_opts(ReasoningKind::deepseek_r1, PromptThink::open), "Step 1: read.\nStep 2: </th");
  EXPECT_EQ(r.reasoning, "Step 1: read.\nStep 2: </th");  // a cut tag at the end is text
  EXPECT_EQ(r.content, "");
  r = whole(reasoning_opts(ReasoningKind::qwen3), "<think>started  \n");
  EXPECT_EQ(r.reasoning, "started");
}

TEST(ServeParsersReasoning, DeepSeekR1WithoutOpeningTag) {
  // R1 (vLLM's rule): reasoning until </think> even when neither prompt nor reply opened it.
  auto r = whole(reasoning_opts(ReasoningKind::deepseek_r1), "thinking</think>answer");
  EXPECT_EQ(r.reasoning, "thinking");
  EXPECT_EQ(r.content, "answer");
  // V3.1 without thinking: the template wrote </think>, the reply is content.
  r = whole(reasoning_opts(ReasoningKind::deepseek_r1, PromptThink::closed), "answer");
  EXPECT_FALSE(r.reasoning);
  EXPECT_EQ(r.content, "answer");
}

TEST(ServeParsersReasoning, ChunkingNeverChangesTheSplit) {
  const std::vector<std::pair<ParseOptions, std::string>> cases = {
      {reasoning_opts(ReasoningKind::qwen3), "<think>\nThe user greets me.\n\nBe nice.\n</think>\n\nHello!"},
      {reasoning_opts(ReasoningKind::qwen3), "  <thinking> is not a tag\n"},
      {reasoning_opts(ReasoningKind::qwen3), "<think>a </th b </think>  c </think> d"},
      {reasoning_opts(ReasoningKind::deepseek_r1, PromptThink::open), "\n\n日本語で考える。\n</think>\n\n答え：４"},
      {reasoning_opts(ReasoningKind::deepseek_r1), "no close tag at all   "},
      {reasoning_opts(ReasoningKind::none), "<think>x</think>y"},
  };
  for (const auto& [o, text] : cases) expect_chunking_invariant(o, text);
}

// --- tool calls --------------------------------------------------------------------

TEST(ServeParsersTools, HermesCallsAndTextBefore) {
  const std::string out =
      "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";
  auto r = whole(tool_opts(ToolCallKind::hermes), out);
  EXPECT_EQ(r.content, "Let me check both.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(args_of(r.calls[0]), Json::parse(R"({"city": "Paris", "days": 2})"));
  EXPECT_EQ(r.calls[1].name, "get_time");
  expect_chunking_invariant(tool_opts(ToolCallKind::hermes), out);
}

TEST(ServeParsersTools, HermesNestedJsonAndOddButValidForms) {
  // Braces and tags inside strings, nesting, unicode; "parameters" for "arguments";
  // arguments sent as a JSON string; no closing tag after complete JSON.
  const std::string out =
      "<tool_call>{\"name\": \"run\", \"arguments\": {\"code\": \"if (a) { b(\\\"}\\\"); }\", \"opts\": {\"x\": [1, "
      "{\"y\": null}]}, \"note\": \"café ☕\"}}</tool_call><tool_call>{\"name\": \"a\", \"parameters\": {\"k\": 1}}"
      "</tool_call><tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>"
      "<tool_call>{\"name\": \"c\", \"arguments\": {}}";
  auto r = whole(tool_opts(ToolCallKind::hermes), out);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 4u);
  EXPECT_EQ(args_of(r.calls[0])["code"], "if (a) { b(\"}\"); }");
  EXPECT_EQ(args_of(r.calls[0])["opts"]["x"][1]["y"], nullptr);
  EXPECT_EQ(args_of(r.calls[0])["note"], "café ☕");
  EXPECT_EQ(args_of(r.calls[1]), Json::parse(R"({"k": 1})"));
  EXPECT_EQ(args_of(r.calls[2]), Json::parse(R"({"k": 2})"));
  EXPECT_EQ(r.calls[3].arguments, "{}");
  expect_chunking_invariant(tool_opts(ToolCallKind::hermes), out);
}

TEST(ServeParsersTools, HermesBrokenCallsStayContent) {
  for (const std::string out : {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1,,}}</tool_call>",
                                "<tool_call>{\"arguments\": {}}</tool_call>",             // no name
                                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",  // not an object
                                "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ",   // cut off
                                "I would use <tool_call> here."}) {
    auto r = whole(tool_opts(ToolCallKind::hermes), out);
    EXPECT_TRUE(r.calls.empty()) << out;
    EXPECT_EQ(r.content, out);
    expect_chunking_invariant(tool_opts(ToolCallKind::hermes), out);
  }
  // A good call survives a broken one next to it.
  auto r = whole(tool_opts(ToolCallKind::hermes),
                 "<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>\n<tool_call>{bad}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "<tool_call>{bad}</tool_call>");
}

TEST(ServeParsersTools, PlainTextIsUntouched) {
  const std::string out = "  A reply with <b>tags</b>, [brackets] and a trailing newline.\n";
  for (ToolCallKind k : {ToolCallKind::hermes, ToolCallKind::qwen3_coder, ToolCallKind::deepseek_v3,
                         ToolCallKind::deepseek_v31, ToolCallKind::mistral}) {
    auto r = whole(tool_opts(k), out);
    EXPECT_EQ(r.content, out) << name_of(k);
    EXPECT_TRUE(r.calls.empty());
    expect_chunking_invariant(tool_opts(k), out);
  }
}

const Json kCoderTools = Json::parse(R"([{"type": "function", "function": {"name": "write_file", "parameters": {
  "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
  "mode": {"type": "integer"}, "ratio": {"type": "number"}, "force": {"type": "boolean"},
  "tags": {"type": "array"}, "meta": {"type": "object"}, "owner": {"type": ["string", "null"]},
  "limit": {"type": ["integer", "null"]}}}}}])");

TEST(ServeParsersTools, Qwen3CoderTypesValuesBySchema) {
  const std::string out =
      "I'll write it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n007.txt\n</parameter>\n"
      "<parameter=content>\nline 1\n  line 2 <b>\n\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
      "<parameter=ratio>\n0.5\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n<parameter=tags>\n[\"a\", "
      "\"b\"]\n</parameter>\n<parameter=meta>\n{\"k\": {\"v\": 1}}\n</parameter>\n<parameter=limit>\nnull\n"
      "</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>";
  auto r = whole(tool_opts(ToolCallKind::qwen3_coder, kCoderTools), out);
  EXPECT_EQ(r.content, "I'll write it.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "write_file");
  EXPECT_EQ(args_of(r.calls[0]), Json::parse(R"({"path": "007.txt", "content": "line 1\n  line 2 <b>\n",
      "mode": 420, "ratio": 0.5, "force": true, "tags": ["a", "b"], "meta": {"k": {"v": 1}}, "limit": null,
      "extra": "42"})"));
  expect_chunking_invariant(tool_opts(ToolCallKind::qwen3_coder, kCoderTools), out);
}

TEST(ServeParsersTools, Qwen3CoderLenientAndBroken) {
  const auto o = tool_opts(ToolCallKind::qwen3_coder, kCoderTools);
  // Values that do not read as their type stay strings; a parameter left open ends at
  // the next one; two calls; a bare <function=...> without <tool_call>.
  const std::string out =
      "<tool_call><function=write_file><parameter=mode>rw</parameter><parameter=path>a.txt<parameter=force>maybe"
      "</function></tool_call><tool_call><function=ls></function></tool_call>\n<function=pwd>\n</function>";
  auto r = whole(o, out);
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(args_of(r.calls[0]), Json::parse(R"({"mode": "rw", "path": "a.txt", "force": "maybe"})"));
  EXPECT_EQ(r.calls[1].name, "ls");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[2].name, "pwd");
  EXPECT_EQ(r.content, "");
  expect_chunking_invariant(o, out);
  for (const std::string bad : {"<tool_call>prose, not a function</tool_call>",
                                "<tool_call><function=f><parameter=a>1</parameter>",  // cut off
                                "<function=f> never closed",
                                "<tool_call><function=f>junk<parameter=a>1</parameter></function></tool_call>"}) {
    auto b = whole(o, bad);
    EXPECT_TRUE(b.calls.empty()) << bad;
    EXPECT_EQ(b.content, bad);
    expect_chunking_invariant(o, bad);
  }
}

TEST(ServeParsersTools, DeepSeekV3AndR1) {
  const std::string out =
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Hangzhou\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
      "```json\n{\"tz\": \"Asia/Shanghai\", \"fmt\": {\"h24\": true}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  for (ToolCallKind k : {ToolCallKind::deepseek_v3, ToolCallKind::deepseek_v31}) {
    auto r = whole(tool_opts(k), out);
    EXPECT_EQ(r.content, "Checking.");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(args_of(r.calls[1]), Json::parse(R"({"tz": "Asia/Shanghai", "fmt": {"h24": true}})"));
    expect_chunking_invariant(tool_opts(k), out);
  }
}

TEST(ServeParsersTools, DeepSeekV31) {
  const std::string out =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"moe ep\", \"n\": 3}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>open<｜tool▁sep｜>{\"url\": \"https://x.test/?a=1&b={2}\"}<｜tool▁call▁end｜>";  // no calls_end
  auto r = whole(tool_opts(ToolCallKind::deepseek_v31), out);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(args_of(r.calls[0]), Json::parse(R"({"q": "moe ep", "n": 3})"));
  EXPECT_EQ(args_of(r.calls[1])["url"], "https://x.test/?a=1&b={2}");
  expect_chunking_invariant(tool_opts(ToolCallKind::deepseek_v31), out);
  // Broken JSON: the call's text (its own markers included) stays content.
  const std::string bad = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": }<｜tool▁call▁end｜>";
  auto b = whole(tool_opts(ToolCallKind::deepseek_v31), bad);
  EXPECT_TRUE(b.calls.empty());
  EXPECT_EQ(b.content, bad);
}

TEST(ServeParsersTools, MistralForms) {
  const auto o = tool_opts(ToolCallKind::mistral);
  const std::string out =
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris]\"}}, {\"name\": \"get_time\", "
      "\"arguments\": {}}]";
  auto r = whole(o, out);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(args_of(r.calls[0])["city"], "Paris]");
  EXPECT_EQ(r.calls[1].name, "get_time");
  expect_chunking_invariant(o, out);
  // The later tokenizers' form: NAME{json} or NAME[ARGS]{json}, one marker per call.
  const std::string v11 = "Sure.[TOOL_CALLS]add{\"a\": 3.5, \"b\": 4}[TOOL_CALLS]mul[ARGS]{\"a\": 2}";
  r = whole(o, v11);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "add");
  EXPECT_EQ(args_of(r.calls[1]), Json::parse(R"({"a": 2})"));
  expect_chunking_invariant(o, v11);
  for (const std::string bad : {"[TOOL_CALLS] sure, calling now", "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {",
                                "[TOOL_CALLS] [{\"arguments\": {}}]"}) {
    auto b = whole(o, bad);
    EXPECT_TRUE(b.calls.empty()) << bad;
    EXPECT_EQ(b.content, bad);
    expect_chunking_invariant(o, bad);
  }
}

TEST(ServeParsersTools, NamedToolChoiceKeepsOnlyThatFunction) {
  auto o = tool_opts(ToolCallKind::hermes);
  o.only_name = "b";
  const std::string out =
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}"
      "</tool_call>";
  auto r = whole(o, out);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "b");
  EXPECT_EQ(r.content, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>");
}

TEST(ServeParsersTools, ReasoningThenCallsNeverCallsInsideThinking) {
  ParseOptions o = tool_opts(ToolCallKind::hermes);
  o.reasoning = ReasoningKind::qwen3;
  const std::string out =
      "<think>\nMaybe <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call>?\n</think>\n\n"
      "<tool_call>\n{\"name\": \"yes\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  auto r = whole(o, out);
  EXPECT_EQ(r.reasoning, "Maybe <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call>?");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "yes");
  expect_chunking_invariant(o, out);
}

TEST(ServeParsersTools, RandomIdsHaveTheRightShape) {
  const std::string a = random_ids(ToolCallKind::hermes)(), b = random_ids(ToolCallKind::hermes)();
  EXPECT_EQ(a.size(), 29u);
  EXPECT_TRUE(a.starts_with("call_"));
  EXPECT_NE(a, b);
  const std::string m = random_ids(ToolCallKind::mistral)();  // Mistral templates demand 9 alphanumerics
  EXPECT_EQ(m.size(), 9u);
  for (char c : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)));
}

// --- choosing the parsers ----------------------------------------------------------

TEST(ServeParsersDetect, FromTemplateMarkup) {
  EXPECT_EQ(detect_tool_calls("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"), ToolCallKind::hermes);
  EXPECT_EQ(detect_tool_calls("<tool_call>\\n<function=' + name + '>\\n<parameter=' + k"), ToolCallKind::qwen3_coder);
  EXPECT_EQ(detect_tool_calls("'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
                              "name + '\\n```json\\n'"),
            ToolCallKind::deepseek_v3);
  EXPECT_EQ(detect_tool_calls("'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>' + args"),
            ToolCallKind::deepseek_v31);
  EXPECT_EQ(detect_tool_calls("{{ '[TOOL_CALLS] [' }}"), ToolCallKind::mistral);
  EXPECT_EQ(detect_tool_calls("<|im_start|>{{ m.content }}"), ToolCallKind::none);
  EXPECT_EQ(detect_reasoning("{{ '<｜Assistant｜><think>\\n' }}", true), ReasoningKind::deepseek_r1);
  EXPECT_EQ(detect_reasoning("<think>\\n\\n</think>", true), ReasoningKind::qwen3);
  EXPECT_EQ(detect_reasoning("<think>\\n\\n</think>", false), ReasoningKind::none);  // no think tokens
  EXPECT_EQ(detect_reasoning("<|im_start|>", true), ReasoningKind::none);
}

}  // namespace
}  // namespace moe::serve::parsers
