// config.json values a hostile or broken file can hold, through the readers a model load
// runs (MoeConfig::from_hf, model_config_from_hf with the family hooks,
// parse_quant_config): each is a moe::Error naming the field, never a crash, undefined
// behaviour or an nlohmann exception. fuzz/fuzz_config.cpp found the type_error; the
// overflows and the deep values were found reading the code and building its inputs
// (a 2 MB value is past the fuzzer's input sizes).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_brief.h"
#include "loader/quant_config.h"
#include "model/registry.h"
#include "moe/config.h"
#include "test_util.h"

namespace moe {
namespace {

using nlohmann::json;

json fixture_config(const std::string& family) {
  std::ifstream in(test::fixtures_dir() + "/" + family + "/config.json");
  return json::parse(in);
}

// `fn` throws moe::Error (and nothing else) whose message holds each of `words` and is
// short enough to read (a hostile value is rendered briefly, not whole).
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 600u) << msg.substr(0, 600);
  }
}

// A value nested `depth` arrays deep, built (and only ever moved) without recursion:
// copying or dumping it would recurse once per level.
json nested(int depth) {
  json j = json::array();
  for (int i = 1; i < depth; ++i) {
    json outer = json::array();
    outer.push_back(std::move(j));
    j = std::move(outer);
  }
  return j;
}

TEST(ConfigHostile, FieldsOfTheWrongTypeAreErrorsNamingThem) {
  // json::value() threw nlohmann's type_error for these (not a moe::Error).
  json c = fixture_config("qwen3_moe");
  c["model_type"] = 7;
  expect_error([&] { model_config_from_hf(c); }, {"model_type"});
  c = fixture_config("qwen3_moe");
  c["tie_word_embeddings"] = "yes";
  expect_error([&] { model_config_from_hf(c); }, {"tie_word_embeddings", "true or false"});
  c = fixture_config("qwen3_moe");
  c["use_sliding_window"] = 1;
  expect_error([&] { model_config_from_hf(c); }, {"use_sliding_window", "true or false"});
  c = fixture_config("deepseek_v3");
  c["rope_interleave"] = "no";
  expect_error([&] { model_config_from_hf(c); }, {"rope_interleave", "true or false"});
  c = fixture_config("ernie4_5_moe");
  c["use_bias"] = json::object();
  expect_error([&] { model_config_from_hf(c); }, {"use_bias", "true or false"});
}

TEST(ConfigHostile, OutOfRangeNumbersAreErrorsNotOverflows) {
  // 2^64 - 1 read as an int64 wrapped to -1 ("must be positive, found -1").
  json c = fixture_config("qwen3_moe");
  c["num_experts"] = UINT64_MAX;
  expect_error([&] { MoeConfig::from_hf(c); }, {"num_experts", "integer", "18446744073709551615"});
  c = fixture_config("qwen3_moe");
  c["vocab_size"] = UINT64_MAX;
  expect_error([&] { model_config_from_hf(c); }, {"vocab_size", "integer"});
  // moe_intermediate_size x n_shared_experts overflowed int64 (undefined) before any bound.
  c = fixture_config("deepseek_v3");
  c["n_shared_experts"] = int64_t{1} << 62;
  expect_error([&] { MoeConfig::from_hf(c); }, {"n_shared_experts", "4611686018427387904"});
  c = fixture_config("ernie4_5_moe");
  c["moe_num_shared_experts"] = -1;
  expect_error([&] { MoeConfig::from_hf(c); }, {"moe_num_shared_experts", "-1"});
  // qk_nope_head_dim + qk_rope_head_dim overflowed int64 in the softmax scale.
  c = fixture_config("deepseek_v3");
  c["qk_nope_head_dim"] = INT64_MAX;
  c["qk_rope_head_dim"] = INT64_MAX;
  expect_error([&] { model_config_from_hf(c); }, {"implausibly large"});
  // original_max_position_embeddings went through an undefined double -> int64 conversion.
  c = fixture_config("deepseek_v3");
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1e300}};
  expect_error([&] { model_config_from_hf(c); }, {"original_max_position_embeddings"});
  c["rope_parameters"]["original_max_position_embeddings"] = 0.5;
  expect_error([&] { model_config_from_hf(c); }, {"original_max_position_embeddings"});
  c["rope_parameters"]["original_max_position_embeddings"] = 4096;
  EXPECT_EQ(model_config_from_hf(c).rope.original_max_position, 4096);
}

TEST(ConfigHostile, DeeplyNestedValuesAreShortErrors) {
  // Error messages rendered the value with dump(), one stack frame per level: a value
  // 10^6 levels deep (2 MB of brackets) overflowed the stack. The rope block was copied
  // (the same recursion) before it was read.
  const int depth = 1000000;
  json c = fixture_config("qwen3_moe");
  c["mlp_only_layers"] = json::array();
  c["mlp_only_layers"].push_back(nested(depth));
  expect_error([&] { MoeConfig::from_hf(c); }, {"mlp_only_layers", "[[[[[...]]]]]"});
  c = fixture_config("qwen3_moe");
  c["num_experts"] = nested(depth);
  expect_error([&] { MoeConfig::from_hf(c); }, {"num_experts"});
  c = fixture_config("qwen3_moe");
  c["rope_parameters"]["x"] = nested(depth);
  EXPECT_NO_THROW(model_config_from_hf(c));  // an unknown key, read past without a copy
  c["rope_parameters"]["rope_theta"] = nested(depth);
  expect_error([&] { model_config_from_hf(c); }, {"rope_theta", "a number"});
  c = fixture_config("qwen3_moe");
  c["quantization_config"] = {{"quant_method", "fp8"}};
  c["quantization_config"]["weight_block_size"] = nested(depth);
  expect_error([&] { parse_quant_config(c); }, {"weight_block_size"});
  c["quantization_config"] = nested(depth);
  expect_error([&] { parse_quant_config(c); }, {"quantization_config must be an object"});
}

TEST(ConfigHostile, BriefRenderingIsBoundedAndFaithfulForSmallValues) {
  EXPECT_EQ(json_brief(json::parse(R"({"a":[1,2.5,"x"],"b":null})")), R"({"a":[1,2.5,"x"],"b":null})");
  EXPECT_EQ(json_brief(json::parse(R"([[[["deep"]]]])")), R"([[[["deep"]]]])");  // 4 levels: whole
  EXPECT_EQ(json_brief(json::parse(R"([[[[["deep"]]]]])")), R"([[[[[...]]]]])");
  EXPECT_EQ(json_brief(json(std::string(1000, 'a')), 10), "\"aaaaaa...");
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string s = json_brief(big);
  EXPECT_EQ(s.size(), 80u);
  EXPECT_EQ(s.substr(0, 8), "[0,1,2,3");
  EXPECT_EQ(s.substr(77), "...");
  // A string cut inside a multi-byte character is rendered, not thrown.
  EXPECT_NO_THROW(json_brief(json("\xc3\xa9\xc3\xa9\xc3\xa9"), 4));
}

}  // namespace
}  // namespace moe
