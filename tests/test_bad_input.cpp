// Bad input a user can cause: each gives an error naming the thing and what was
// expected, from the C++ API and as a non-zero exit of `moe-ep layer`, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/cpu.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/config.h"
#include "test_mutate.h"
#include "test_util.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::mutate_fixture;
using test::Tensors;

std::string cli_layer(const std::string& model, int layer, const std::string& input, int* rc) {
  test::TempDir out;
  std::string log;
  *rc = test::run_command(std::string(MOE_EP_BINARY) + " layer --model " + model + " --layer " + std::to_string(layer) +
                              " --input " + input + " --output " + (out / "y.safetensors"),
                          &log);
  return log;
}

std::string input_of(const std::string& fixture, int layer, int T) {
  return test::fixtures_dir() + "/" + fixture + "/golden/L" + std::to_string(layer) + "_T" + std::to_string(T) +
         "_in.safetensors";
}

// Expects `fn` to throw moe::Error whose message holds every one of `words`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

void expect_cli_error(const std::string& model, int layer, const std::string& input,
                      const std::vector<std::string>& words) {
  int rc = 0;
  const std::string log = cli_layer(model, layer, input, &rc);
  EXPECT_EQ(rc, 1) << log;  // 1: a clean error exit; a signal would read 128+
  EXPECT_NE(log.find("moe-ep: error:"), std::string::npos) << log;
  for (const auto& w : words) EXPECT_NE(log.find(w), std::string::npos) << log;
}

TEST(BadInput, MissingExpertTensor) {
  test::TempDir d;
  const std::string key = "model.layers.0.mlp.experts.7.up_proj.weight";
  mutate_fixture("qwen3_moe", d.path(), [&](Tensors& ts) {
    std::erase_if(ts, [&](const auto& p) { return p.first == key; });
  });
  Checkpoint ck = Checkpoint::open(d.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  expect_error([&] { load_moe_layer(ck, cfg, 0, {}); }, {key, "layer 0", "[24, 40]"});
  expect_cli_error(d.path(), 0, input_of("qwen3_moe", 0, 7), {key, "[24, 40]"});
}

TEST(BadInput, WrongShape) {
  test::TempDir d;
  const std::string key = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  mutate_fixture("mixtral", d.path(), [&](Tensors& ts) {
    for (auto& [name, t] : ts)
      if (name == key) t = Tensor::zeros({32, 23}, DType::F32);
  });
  expect_cli_error(d.path(), 1, input_of("mixtral", 1, 7), {key, "[32, 23]", "[32, 24]", "model.safetensors"});
}

TEST(BadInput, UnknownModelType) {
  test::TempDir d;
  mutate_fixture("mixtral", d.path(), {}, [](json& c) { c["model_type"] = "llama4"; });
  expect_error([&] { MoeConfig::from_hf(Checkpoint::open(d.path()).config()); },
               {"llama4", "qwen3_moe", "deepseek_v3", "ernie4_5_moe"});
  expect_cli_error(d.path(), 0, input_of("mixtral", 0, 7), {"model_type", "llama4", "mixtral"});
}

TEST(BadInput, MissingOrInvalidConfigFields) {
  test::TempDir d;
  mutate_fixture("qwen3_moe", d.path(), {}, [](json& c) { c.erase("hidden_size"); });
  expect_cli_error(d.path(), 0, input_of("qwen3_moe", 0, 7), {"hidden_size"});
  test::TempDir d2;
  mutate_fixture("qwen3_moe", d2.path(), {}, [](json& c) { c["num_experts_per_tok"] = 61; });
  expect_cli_error(d2.path(), 0, input_of("qwen3_moe", 0, 7), {"61", "60 experts"});
  test::TempDir d3;
  mutate_fixture("qwen3_moe", d3.path(), {}, [](json& c) { c["num_experts"] = -4; });
  expect_cli_error(d3.path(), 0, input_of("qwen3_moe", 0, 7), {"positive", "-4"});
  test::TempDir d4;
  mutate_fixture("deepseek_v3", d4.path(), {}, [](json& c) { c["n_group"] = 5; });
  expect_cli_error(d4.path(), 1, input_of("deepseek_v3", 1, 7), {"n_group=5"});
  test::TempDir d5;
  mutate_fixture("qwen3_moe", d5.path(), {}, [](json& c) { c["hidden_size"] = "forty"; });
  expect_cli_error(d5.path(), 0, input_of("qwen3_moe", 0, 7), {"hidden_size", "integer"});
}

TEST(BadInput, NaNInConfigIsRejected) {
  test::TempDir d;
  mutate_fixture("deepseek_v3", d.path(), {});
  // JSON has no NaN, but Python's json.dump writes one: the parse must fail cleanly.
  std::ifstream in(d / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const auto pos = text.find("\"routed_scaling_factor\": 2.5");
  ASSERT_NE(pos, std::string::npos);
  text.replace(pos, 28, "\"routed_scaling_factor\": NaN");
  std::ofstream(d / "config.json") << text;
  expect_cli_error(d.path(), 1, input_of("deepseek_v3", 1, 7), {"config.json"});
}

TEST(BadInput, InputWithWrongHiddenSize) {
  test::TempDir d;
  write_safetensors(d / "x.safetensors", {{"hidden_states", test::random_f32({3, 41}, 1.f, 1)}});
  expect_cli_error(test::fixtures_dir() + "/qwen3_moe", 0, d / "x.safetensors", {"hidden_states", "[3, 41]", "40"});
  write_safetensors(d / "y.safetensors", {{"other", test::random_f32({3, 40}, 1.f, 1)}});
  expect_cli_error(test::fixtures_dir() + "/qwen3_moe", 0, d / "y.safetensors", {"hidden_states"});
  write_safetensors(d / "z.safetensors", {{"hidden_states", Tensor::zeros({3, 40}, DType::I32)}});
  expect_cli_error(test::fixtures_dir() + "/qwen3_moe", 0, d / "z.safetensors", {"dtype", "i32"});
}

TEST(BadInput, LayerOutOfRangeAndBadFlags) {
  expect_cli_error(test::fixtures_dir() + "/qwen3_moe", 9, input_of("qwen3_moe", 0, 7), {"--layer 9", "3 layers"});
  std::string log;
  EXPECT_NE(test::run_command(std::string(MOE_EP_BINARY) + " layer --model " + test::fixtures_dir() +
                                  "/qwen3_moe --layer 0 --input " + input_of("qwen3_moe", 0, 7) +
                                  " --output /dev/null --dtype f64",
                              &log),
            0);
  EXPECT_NE(log.find("--dtype"), std::string::npos) << log;
  EXPECT_EQ(test::run_command(std::string(MOE_EP_BINARY) + " layer --help", &log), 0);
  for (const char* flag : {"--model", "--layer", "--input", "--output", "--dtype", "--threads", "--isa"})
    EXPECT_NE(log.find(flag), std::string::npos) << flag;
}

// generate --prefill-chunk: a negative chunk is refused by name; 1 (a token per step)
// still generates.
TEST(BadInput, GeneratePrefillChunk) {
  const std::string base = std::string(MOE_EP_BINARY) + " generate --model " + test::fixtures_dir() +
                           "/qwen3_moe --prompt-ids 1,2,3,4 --max-new-tokens 2 --quiet";
  std::string log;
  EXPECT_NE(test::run_command(base + " --prefill-chunk -3", &log), 0);
  EXPECT_NE(log.find("--prefill-chunk must be 0 (whole prompts) or a positive token count, got -3"), std::string::npos)
      << log;
  EXPECT_EQ(test::run_command(base + " --prefill-chunk 1", &log), 0) << log;
}

// --isa and MOE_ISA above this CPU stop the run with the reason, instead of running a
// lower level; a level the CPU has runs.
TEST(BadInput, IsaAboveTheCpuFails) {
  test::TempDir out;
  const std::string cmd = std::string(MOE_EP_BINARY) + " layer --model " + test::fixtures_dir() +
                          "/qwen3_moe --layer 0 --input " + input_of("qwen3_moe", 0, 7) + " --output " +
                          (out / "y.safetensors");
  std::string log;
  EXPECT_EQ(test::run_command(cmd + " --isa " + isa_name(hardware_isa()), &log), 0) << log;
  EXPECT_EQ(test::run_command("MOE_ISA=portable " + cmd, &log), 0) << log;
  if (hardware_isa() == kTopIsa) GTEST_SKIP() << "this CPU has every level";
  // The level just above this CPU's, and a feature that level needs and this CPU lacks.
  const Isa above = static_cast<Isa>(static_cast<int>(hardware_isa()) + 1);
  const char* feature = above == Isa::Avx2     ? "AVX2"
                        : above == Isa::Avx512 ? "AVX512F"
                        : above == Isa::Avx512Bf16 ? "AVX512_BF16"
                                                   : "AMX-INT8";
  const std::string name = isa_name(above);
  EXPECT_NE(test::run_command(cmd + " --isa " + name, &log), 0);
  EXPECT_NE(log.find("--isa " + name + ": this CPU has no "), std::string::npos) << log;
  EXPECT_NE(log.find(feature), std::string::npos) << log;
  EXPECT_NE(test::run_command("MOE_ISA=" + name + " " + cmd, &log), 0);
  EXPECT_NE(log.find("MOE_ISA=" + name + ": this CPU has no "), std::string::npos) << log;
}

TEST(BadInput, TruncatedCheckpoint) {
  test::TempDir d;
  mutate_fixture("mixtral", d.path(), {});
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") / 2);
  expect_cli_error(d.path(), 0, input_of("mixtral", 0, 7), {"model.safetensors"});
}

}  // namespace
}  // namespace moe
