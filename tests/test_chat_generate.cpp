// Text in, text out on the talking fixture models (tests/fixtures/chat_*: tiny MoE
// models with a tokenizer and a chat template, made by tools/gen_chat_fixtures.py):
// the rendered prompt, its ids, transformers' greedy ids (stopping at EOS, and with EOS
// disabled) and the decoded text all equal transformers'; the same through the CLI
// (`moe-ep generate --chat / --prompt --output-json`) and through the server's engine;
// and chat_qwen3 as a GGUF file gives the same.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "loader/gguf/gguf_checkpoint.h"
#include "loader/gguf/gguf_file.h"
#include "loader/gguf/gguf_tokenizer.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_model_util.h"
#include "text/chat_template.h"
#include "text/text_stream.h"
#include "text/tokenizer.h"

namespace moe {
namespace {

struct ChatFixture {
  std::string name, dir;
  nlohmann::json golden;
};

void PrintTo(const ChatFixture& f, std::ostream* os) { *os << f.name; }

std::vector<ChatFixture> chat_fixtures() {
  std::vector<ChatFixture> out;
  // chat_qwen3_gguf: chat_qwen3 as a GGUF file (tests/fixtures/gguf/models, written by
  // tools/gen_gguf_model_fixtures.py as convert_hf_to_gguf.py writes it), its tokenizer
  // and template from the tokenizer.* metadata; transformers' goldens of the directory.
  for (const char* n : {"chat_qwen3", "chat_deepseek_v3", "chat_qwen3_gguf"}) {
    ChatFixture f;
    f.name = n;
    const std::string src = f.name == "chat_qwen3_gguf" ? "chat_qwen3" : f.name;
    f.dir = f.name == "chat_qwen3_gguf" ? test::fixtures_dir() + "/gguf/models/chat_qwen3-BF16.gguf"
                                        : test::fixtures_dir() + "/" + src;
    const std::string golden = test::fixtures_dir() + "/" + src + "/golden/chat_greedy.json";
    std::ifstream in(golden);
    if (!in) ADD_FAILURE() << "missing " << golden;
    else f.golden = nlohmann::json::parse(in);
    out.push_back(std::move(f));
  }
  return out;
}

// The tokenizer and chat template of a fixture directory or GGUF file (as the CLI's
// load_text_model reads them).
struct TextOf {
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<text::ChatTemplate> tmpl;
};
TextOf text_of(const std::string& path) {
  if (!gguf::is_gguf_file(path))
    return {text::Tokenizer::from_dir(path), std::make_unique<text::ChatTemplate>(text::ChatTemplate::from_dir(path))};
  const gguf::TokenizerFiles files = gguf::tokenizer_files(gguf::GgufModel::open(path).metadata(), path);
  return {text::Tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json, path),
          std::make_unique<text::ChatTemplate>(files.chat_template, path)};
}

std::vector<int32_t> prompt_ids(const text::Tokenizer& tok, const text::ChatTemplate& tmpl, const nlohmann::json& p,
                                std::string* rendered) {
  if (p["kind"] == "chat") {
    text::ChatRequest req;
    req.messages = p["messages"];
    req.add_generation_prompt = p.value("add_generation_prompt", true);
    if (p.contains("kwargs") && p["kwargs"].is_object()) req.kwargs = p["kwargs"];
    *rendered = tmpl.render(req, tok.special_tokens());
    text::EncodeOptions eo;
    eo.add_special_tokens = false;  // apply_chat_template(tokenize=True): the template writes BOS
    return tok.encode(*rendered, eo);
  }
  *rendered = p["prompt_text"].get<std::string>();
  return tok.encode(*rendered);
}

class ChatGenerate : public ::testing::TestWithParam<ChatFixture> {};

TEST_P(ChatGenerate, PromptsIdsAndGreedyTextEqualTransformers) {
  const ChatFixture& f = GetParam();
  ASSERT_FALSE(f.golden.is_null());
  TextOf t = text_of(f.dir);
  auto& tok = t.tok;
  const text::ChatTemplate& tmpl = *t.tmpl;
  auto m = test::load_model(f.dir, DType::F32, 1, 128);
  int stopped = 0;
  for (const auto& p : f.golden["prompts"]) {
    SCOPED_TRACE(p["name"].get<std::string>());
    std::string rendered;
    const std::vector<int32_t> ids = prompt_ids(*tok, tmpl, p, &rendered);
    EXPECT_EQ(rendered, p["prompt_text"].get<std::string>());
    ASSERT_EQ(ids, p["prompt_ids"].get<std::vector<int32_t>>());
    for (bool ignore_eos : {false, true}) {
      GenerateOptions go;
      go.max_new_tokens = f.golden["max_new_tokens"];
      go.ignore_eos = ignore_eos;
      if (tok->special_tokens().eos_id >= 0) go.extra_eos.push_back(tok->special_tokens().eos_id);
      const GenerateResult r = generate(*m, {ids}, go);
      const auto want = p[ignore_eos ? "generated_no_eos" : "generated"].get<std::vector<int32_t>>();
      EXPECT_EQ(r.tokens[0], want) << (ignore_eos ? "EOS ignored" : "stopping at EOS");
      // The streamed text (EOS not fed, as generate --chat does) equals decode(skip_special_tokens=True).
      text::TextStream ts(*tok, {}, {true});
      std::string streamed;
      for (int32_t t : r.tokens[0]) {
        const auto& eos = m->config().eos_token_ids;
        if (!ignore_eos && (std::find(eos.begin(), eos.end(), t) != eos.end() || t == tok->special_tokens().eos_id))
          break;
        streamed += ts.push(t).text;
      }
      streamed += ts.finish().text;
      EXPECT_EQ(streamed, p[ignore_eos ? "text_no_eos" : "text"].get<std::string>());
      text::DecodeOptions keep;
      EXPECT_EQ(tok->decode(r.tokens[0], keep), p[ignore_eos ? "text_no_eos_with_special" : "text_with_special"]);
    }
    stopped += p["stopped_at_eos"].get<bool>();
  }
  EXPECT_GE(stopped, 1) << "no golden run stops at EOS: the EOS path is not exercised";
}

// `moe-ep generate --chat` prints what transformers decodes.
TEST_P(ChatGenerate, CliGenerateTextEqualsTransformers) {
  const ChatFixture& f = GetParam();
  ASSERT_FALSE(f.golden.is_null());
  auto quote = [](const std::string& x) {
    std::string q = "'";
    for (char c : x) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  int checked = 0;
  for (const auto& p : f.golden["prompts"]) {
    std::string flag;
    if (p["kind"] == "text") flag = "--prompt " + quote(p["prompt_text"]);
    else if (p["messages"].size() == 1 && p["messages"][0]["role"] == "user" && p["messages"][0]["content"].is_string())
      flag = "--chat " + quote(p["messages"][0]["content"]);
    else continue;
    if (p.contains("kwargs") && p["kwargs"].is_object() && !p["kwargs"].empty())
      flag += " --template-kwargs " + quote(p["kwargs"].dump());
    const std::string out = testing::TempDir() + "/chat_gen_" + f.name + ".json";
    const std::string cmd = fmt::format("{} generate --model {} --max-new-tokens {} --quiet --output-json {} {}",
                                        MOE_EP_BINARY, f.dir, f.golden["max_new_tokens"].get<int>(), out, flag);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(out);
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["text"][0].get<std::string>(), p["text"].get<std::string>()) << cmd;
    EXPECT_EQ(j["generated"][0].get<std::vector<int32_t>>(), p["generated"].get<std::vector<int32_t>>()) << cmd;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChatGenerate, ::testing::ValuesIn(chat_fixtures()),
                         [](const auto& i) { return i.param.name; });

}  // namespace
}  // namespace moe
