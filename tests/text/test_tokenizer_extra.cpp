// Extra tokenizer goldens (tests/fixtures/text/extra_tokenizers.json, written by
// tools/gen_text_extra.py with HF `tokenizers` / transformers): components and loading
// paths the main fixtures leave out (BertNormalizer, WordLevel, CTC, Unigram byte
// fallback, legacy "a b" merges, Metaspace "first" after a normaliser that moves text,
// tokenizer_config.json add_bos_token/add_eos_token and added tokens).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using moe::text::Tokenizer;

namespace {

const fs::path kExtra = fs::path(MOE_FIXTURES_DIR) / "text" / "extra_tokenizers.json";

const json& extra() {
  static const json j = [] {
    std::ifstream f(kExtra, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

std::vector<std::string> names() {
  std::vector<std::string> out;
  if (!fs::exists(kExtra)) return out;
  for (const auto& t : extra().at("tokenizers")) out.push_back(t.at("name").get<std::string>());
  return out;
}

const json& entry(const std::string& name) {
  for (const auto& t : extra().at("tokenizers"))
    if (t.at("name") == name) return t;
  throw std::runtime_error("no extra tokenizer " + name);
}

class TokExtra : public ::testing::TestWithParam<std::string> {};

TEST(TokExtraFile, Exists) { ASSERT_TRUE(fs::exists(kExtra)) << kExtra; }

TEST_P(TokExtra, MatchesGolden) {
  const json& e = entry(GetParam());
  auto tok = Tokenizer::from_json(e.at("tokenizer_json").get<std::string>(), e.at("config_json").get<std::string>(),
                                  GetParam());
  EXPECT_EQ(tok->vocab_size(), e.at("vocab_size").get<int64_t>());
  const json& texts = extra().at("texts");
  const json& cases = e.at("cases");
  ASSERT_EQ(texts.size(), cases.size());
  int bad = 0;
  for (size_t i = 0; i < texts.size() && bad < 20; ++i) {
    const std::string text = texts[i].get<std::string>();
    const json& c = cases[i];
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok->encode(text);
    const auto plain = tok->encode(text, {.add_special_tokens = false});
    const auto split = tok->encode(text, {.add_special_tokens = false, .parse_special = false});
    const std::string show = json(text).dump();
    EXPECT_EQ(got, ids) << "case " << i << " " << show;
    EXPECT_EQ(plain, c.at("ids_plain").get<std::vector<int32_t>>()) << "case " << i << " " << show;
    EXPECT_EQ(split, c.at("ids_split_special").get<std::vector<int32_t>>()) << "case " << i << " " << show;
    EXPECT_EQ(tok->decode(ids), c.at("decode").get<std::string>()) << "case " << i << " " << show;
    EXPECT_EQ(tok->decode(ids, {.skip_special_tokens = true}), c.at("decode_skip").get<std::string>())
        << "case " << i << " " << show;
    if (got != ids || tok->decode(ids) != c.at("decode").get<std::string>()) ++bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Tok, TokExtra, ::testing::ValuesIn(names()), [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TokExtra);

}  // namespace
