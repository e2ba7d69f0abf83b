// Chat rendering against transformers 5.24's apply_chat_template(..., tokenize=False):
// every template x case of tests/fixtures/text/chat_golden.json (written by
// tools/gen_text_fixtures.py), and the places a template is loaded from.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "text/chat_template.h"

using moe::text::ChatRequest;
using moe::text::ChatTemplate;
using ojson = nlohmann::ordered_json;

namespace {

const std::string kDir = std::string(MOE_FIXTURES_DIR) + "/text/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const ojson& golden() {
  static const ojson g = [] {
    std::string t = read_file(kDir + "chat_golden.json");
    return t.empty() ? ojson::object() : ojson::parse(t);
  }();
  return g;
}

const ojson& chat_case(const std::string& name) {
  static const ojson c = [] {
    std::string t = read_file(kDir + "chat_cases.json");
    return t.empty() ? ojson::object() : ojson::parse(t);
  }();
  for (const auto& x : c.at("cases"))
    if (x.at("name") == name) return x;
  throw std::runtime_error("no chat case " + name);
}

// The template of a golden "templates" entry, loaded the way a model directory would
// be (from_dir) when it has a tokenizer directory, else from the .jinja file.
const ChatTemplate& template_for(const std::string& name) {
  static std::map<std::string, std::unique_ptr<ChatTemplate>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return *it->second;
  const ojson& info = golden().at("templates").at(name);
  std::unique_ptr<ChatTemplate> t;
  if (info.contains("tokenizer") && info["tokenizer"].is_string()) {
    t = std::make_unique<ChatTemplate>(ChatTemplate::from_dir(kDir + info["tokenizer"].get<std::string>()));
  } else {
    std::string src = info.at("source").get<std::string>();
    t = std::make_unique<ChatTemplate>(read_file(kDir + src), src);
  }
  return *(cache[name] = std::move(t));
}

ChatRequest request_for(const ojson& c, const ojson& extra_kwargs) {
  ChatRequest r;
  r.messages = c.at("messages");
  if (c.contains("tools")) r.tools = c["tools"];
  r.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
  r.kwargs = ojson::object();
  for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it) r.kwargs[it.key()] = *it;
  if (c.contains("kwargs"))
    for (auto it = c["kwargs"].begin(); it != c["kwargs"].end(); ++it) r.kwargs[it.key()] = *it;
  return r;
}

class ChatGolden : public ::testing::TestWithParam<size_t> {};

TEST_P(ChatGolden, MatchesTransformers) {
  const ojson& res = golden().at("results").at(GetParam());
  const std::string tname = res.at("template").get<std::string>();
  const ojson& info = golden().at("templates").at(tname);
  ChatRequest req = request_for(chat_case(res.at("case").get<std::string>()), info.value("extra_kwargs", ojson::object()));
  const ChatTemplate& t = template_for(tname);
  const ojson& special = info.at("special_tokens");
  if (res.contains("text")) {
    std::string got;
    try {
      got = t.render(req, special);
    } catch (const moe::Error& e) {
      FAIL() << "unexpected error: " << e.what();
    }
    EXPECT_EQ(got, res["text"].get<std::string>());
    // Through SpecialTokens, with the tokens from_dir read from tokenizer_config.json.
    if (info.contains("tokenizer") && info["tokenizer"].is_string()) {
      moe::text::SpecialTokens none;
      EXPECT_EQ(t.render(req, none), res["text"].get<std::string>());
    }
    return;
  }
  std::string err;
  try {
    std::string got = t.render(req, special);
    FAIL() << "rendered " << ::testing::PrintToString(got) << " but transformers raised " << res["error"];
  } catch (const moe::Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(res["error"].get<std::string>()), std::string::npos)
      << "ours: " << err << "\ntransformers: " << res["error_type"] << ": " << res["error"];
}

std::vector<size_t> result_indices() {
  std::vector<size_t> v;
  if (golden().contains("results"))
    for (size_t i = 0; i < golden()["results"].size(); ++i) v.push_back(i);
  return v;
}

std::string result_name(const ::testing::TestParamInfo<size_t>& info) {
  const ojson& r = golden().at("results").at(info.param);
  return r.at("template").get<std::string>() + "__" + r.at("case").get<std::string>();
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, ChatGolden, ::testing::ValuesIn(result_indices()), result_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ChatGolden);

TEST(ChatGoldenFile, HasResults) { EXPECT_GE(result_indices().size(), 300u); }

// The special_tokens_map from_dir reads equals what transformers passed.
TEST(ChatLoad, ConfigSpecialTokensMatchTransformers) {
  for (auto it = golden().at("templates").begin(); it != golden().at("templates").end(); ++it) {
    const ojson& info = it.value();
    if (!info.contains("tokenizer") || !info["tokenizer"].is_string()) continue;
    const ChatTemplate& t = template_for(it.key());
    ojson got = ojson::object();
    for (auto e = t.config_special_tokens().begin(); e != t.config_special_tokens().end(); ++e)
      if (e->is_string()) got[e.key()] = *e;
    EXPECT_EQ(nlohmann::json(got), nlohmann::json(info.at("special_tokens"))) << it.key();
  }
}

TEST(ChatLoad, NamedTemplateList) {
  ChatTemplate t = ChatTemplate::from_dir(kDir + "tokenizers/named_templates");
  EXPECT_EQ(t.source(), read_file(kDir + "templates/chatml.jinja"));
  ChatTemplate tool = ChatTemplate::from_dir(kDir + "tokenizers/named_templates", "", "tool_use");
  EXPECT_EQ(tool.source(), read_file(kDir + "templates/qwen3.jinja"));
  EXPECT_THROW(ChatTemplate::from_dir(kDir + "tokenizers/named_templates", "", "nope"), moe::Error);
}

TEST(ChatLoad, JinjaFileWinsOverConfig) {
  ChatTemplate t = ChatTemplate::from_dir(kDir + "tokenizers/jinja_file");
  EXPECT_EQ(t.source(), read_file(kDir + "tokenizers/jinja_file/chat_template.jinja"));
  EXPECT_EQ(t.name(), "chat_template.jinja");
}

TEST(ChatLoad, ExplicitFileWins) {
  ChatTemplate t = ChatTemplate::from_dir(kDir + "tokenizers/qwen3", kDir + "templates/gemma.jinja");
  EXPECT_EQ(t.source(), read_file(kDir + "templates/gemma.jinja"));
  EXPECT_THROW(ChatTemplate::from_dir(kDir + "tokenizers/qwen3", kDir + "templates/nope.jinja"), moe::Error);
}

TEST(ChatLoad, MissingTemplateNamesPlaces) {
  std::string e;
  try {
    ChatTemplate::from_dir(kDir + "tokenizers/bytelevel_gpt2");
  } catch (const moe::Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("chat_template.jinja"), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer_config.json"), std::string::npos) << e;
}

TEST(ChatLoad, SyntaxErrorNamesFileAndLine) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / "moe_chat_tmpl_test";
  fs::create_directories(d);
  std::ofstream(d / "chat_template.jinja") << "ok\n{% for m in messages %}\n{{ m.content }\n{% endfor %}";
  std::string e;
  try {
    ChatTemplate::from_dir(d.string());
  } catch (const moe::Error& err) {
    e = err.what();
  }
  fs::remove_all(d);
  EXPECT_NE(e.find("chat_template.jinja:3:"), std::string::npos) << e;
}

// ---- request handling ---------------------------------------------------------------------------------

const char* kEcho =
    "{% for m in messages %}{{ m|tojson }}\n{% endfor %}tools={{ tools }} docs={{ documents }} "
    "gen={{ add_generation_prompt }} bos={{ bos_token }} x={{ x|default('-') }}";

TEST(ChatRender, DropsNullKeysAndAliasesReasoning) {
  ChatTemplate t(kEcho, "echo");
  ChatRequest r;
  r.messages = ojson::parse(R"([{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
                                {"role": "assistant", "content": "a", "reasoning": "why"},
                                {"role": "assistant", "content": "b", "thinking": "t", "reasoning_content": "rc"}])");
  r.add_generation_prompt = false;
  moe::text::SpecialTokens st;
  st.bos = "<s>";
  EXPECT_EQ(t.render(r, st),
            "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"1\"}]}\n"
            "{\"thinking\": \"why\", \"role\": \"assistant\", \"content\": \"a\", \"reasoning\": \"why\", "
            "\"reasoning_content\": \"why\"}\n"
            "{\"thinking\": \"t\", \"role\": \"assistant\", \"content\": \"b\", \"reasoning_content\": \"rc\"}\n"
            "tools=None docs=None gen=False bos=<s> x=-");
}

TEST(ChatRender, KwargsOverrideSpecialTokens) {
  ChatTemplate t(kEcho, "echo");
  ChatRequest r;
  r.messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  r.kwargs = ojson::parse(R"({"bos_token": "B", "x": 5})");
  r.tools = ojson::array();
  moe::text::SpecialTokens st;
  st.bos = "<s>";
  EXPECT_EQ(t.render(r, st), "{\"role\": \"user\", \"content\": \"hi\"}\ntools=[] docs=None gen=True bos=B x=5");
}

TEST(ChatRender, EmptySpecialTokensAreUndefined) {
  ChatTemplate t("{{ bos_token is defined }}{{ eos_token }}", "t");
  ChatRequest r;
  r.messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  moe::text::SpecialTokens st;
  st.eos = "</s>";
  EXPECT_EQ(t.render(r, st), "False</s>");
}

TEST(ChatRender, RejectsEmptyAndMalformedChats) {
  ChatTemplate t("x", "t");
  ChatRequest r;
  EXPECT_THROW(t.render(r, moe::text::SpecialTokens{}), moe::Error);
  r.messages = ojson::parse(R"(["not a dict"])");
  EXPECT_THROW(t.render(r, moe::text::SpecialTokens{}), moe::Error);
  r.messages = ojson::parse(R"([{"role": "user", "content": "x"}])");
  r.kwargs = ojson::parse(R"({"messages": []})");
  EXPECT_THROW(t.render(r, moe::text::SpecialTokens{}), moe::Error);
}

TEST(ChatRender, ToolUseTemplateChosenWhenToolsGiven) {
  ChatTemplate t = ChatTemplate::from_dir(kDir + "tokenizers/named_templates");
  ChatRequest r;
  r.messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  std::string plain = t.render(r, moe::text::SpecialTokens{});
  r.tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  std::string with_tools = t.render(r, moe::text::SpecialTokens{});
  EXPECT_NE(plain, with_tools);
  EXPECT_NE(with_tools.find("\"name\": \"f\""), std::string::npos) << with_tools;
}

}  // namespace
