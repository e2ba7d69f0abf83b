// Quantisation scale names (loader/scales.h): the mapping table of every family, the
// FastDeploy/ERNIE activation_scale -> in_scale -> act_scale chain, the one up_gate
// activation scale shared by all experts, per-expert down_proj scales for this
// rank's experts only, and 128-byte (0x80) padding.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "loader/scales.h"
#include "moe/config.h"
#include "test_util.h"

namespace moe {
namespace {

using nlohmann::json;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

Tensor scalar(float v) {
  Tensor t = Tensor::empty({1}, DType::F32);
  t.data<float>()[0] = v;
  return t;
}
Tensor vec(int64_t n, float base) {
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = base + i;
  return t;
}

struct Row {
  const char* key;     // checkpoint key
  const char* fd_key;  // FastDeploy intermediate
  const char* engine;
  int64_t expert;
};

void expect_rows(Family f, const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    SCOPED_TRACE(r.key);
    const auto m = match_scale_key(f, r.key);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->fd_key, r.fd_key);
    EXPECT_EQ(m->engine, r.engine);
    EXPECT_EQ(m->expert, r.expert);
  }
}

TEST(LoaderScales, ErnieTableFollowsFastDeploy) {
  expect_rows(Family::Ernie45Moe,
              {
                  {"model.layers.3.self_attn.qkv_proj.activation_scale", "model.layers.3.self_attn.qkv_proj.in_scale",
                   "self_attn.qkv_proj.act_scale", -1},
                  {"model.layers.3.self_attn.o_proj.activation_scale", "model.layers.3.self_attn.o_proj.in_scale",
                   "self_attn.o_proj.act_scale", -1},
                  {"model.layers.3.self_attn.cachek_matmul.activation_scale",
                   "model.layers.3.self_attn.cachek_matmul.in_scale", "self_attn.attn.cache_k_scale", -1},
                  {"model.layers.3.self_attn.cachev_matmul.activation_scale",
                   "model.layers.3.self_attn.cachev_matmul.in_scale", "self_attn.attn.cache_v_scale", -1},
                  {"model.layers.3.self_attn.q_matmul.activation_scale", "model.layers.3.self_attn.q_matmul.in_scale",
                   "self_attn.attn.q_scale", -1},
                  {"model.layers.3.self_attn.s_matmul.activation_scale", "model.layers.3.self_attn.s_matmul.in_scale",
                   "self_attn.attn.s_scale", -1},
                  {"model.layers.3.mlp.up_gate_proj.activation_scale", "model.layers.3.mlp.up_gate_proj.in_scale",
                   "mlp.up_gate_proj.act_scale", -1},
                  {"model.layers.3.mlp.down_proj.activation_scale", "model.layers.3.mlp.down_proj.in_scale",
                   "mlp.down_proj.act_scale", -1},
                  {"model.layers.3.mlp.shared_experts.up_gate_proj.activation_scale",
                   "model.layers.3.mlp.shared_experts.up_gate_proj.in_scale",
                   "mlp.shared_experts.up_gate_proj.act_scale", -1},
                  {"model.layers.3.mlp.shared_experts.down_proj.activation_scale",
                   "model.layers.3.mlp.shared_experts.down_proj.in_scale", "mlp.shared_experts.down_proj.act_scale", -1},
                  {"model.layers.3.mlp.experts.up_gate_proj.activation_scale",
                   "model.layers.3.mlp.experts.up_gate_proj.in_scale", "mlp.experts.up_gate_proj_in_scale", -1},
                  {"model.layers.3.mlp.experts.17.down_proj.activation_scale",
                   "model.layers.3.mlp.experts.17.down_proj.in_scale", "mlp.experts.down_proj_in_scale", 17},
                  {"model.layers.3.mlp.experts.17.up_gate_proj.weight_scale",
                   "model.layers.3.mlp.experts.17.up_gate_proj.weight_scale", "mlp.experts.up_gate_proj_weight_scale",
                   17},
                  {"model.layers.3.mlp.experts.2.down_proj.weight_scale",
                   "model.layers.3.mlp.experts.2.down_proj.weight_scale", "mlp.experts.down_proj_weight_scale", 2},
              });
  const auto shared = match_scale_key(Family::Ernie45Moe, "model.layers.3.mlp.experts.up_gate_proj.activation_scale");
  EXPECT_EQ(shared->entry->scope, ScaleScope::SharedByExperts);
  EXPECT_EQ(match_scale_key(Family::Ernie45Moe, "model.layers.3.mlp.experts.17.down_proj.activation_scale")->entry->scope,
            ScaleScope::PerExpert);
  for (const char* bad : {"model.layers.3.mlp.experts.x.down_proj.activation_scale",
                          "model.layers.3.mlp.experts.01.down_proj.activation_scale",
                          "model.layers..mlp.down_proj.activation_scale", "lm_head.activation_scale",
                          "model.layers.3.mlp.gate.weight"})
    EXPECT_FALSE(match_scale_key(Family::Ernie45Moe, bad).has_value()) << bad;
}

TEST(LoaderScales, HuggingFaceTablesPerFamily) {
  expect_rows(Family::Qwen3Moe,
              {{"model.layers.0.mlp.experts.3.down_proj.weight_scale_inv",
                "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv", "mlp.experts.down_proj_weight_scale_inv", 3},
               {"model.layers.0.self_attn.q_proj.input_scale", "model.layers.0.self_attn.q_proj.input_scale",
                "self_attn.q_proj.act_scale", -1}});
  expect_rows(Family::Qwen2Moe, {{"model.layers.1.mlp.shared_expert.up_proj.input_scale",
                                  "model.layers.1.mlp.shared_expert.up_proj.input_scale",
                                  "mlp.shared_expert.up_proj.act_scale", -1}});
  expect_rows(Family::Mixtral,
              {{"model.layers.1.block_sparse_moe.experts.7.w2.input_scale",
                "model.layers.1.block_sparse_moe.experts.7.w2.input_scale", "mlp.experts.w2_act_scale", 7},
               {"model.layers.1.block_sparse_moe.experts.0.w1.weight_scale",
                "model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", "mlp.experts.w1_weight_scale", 0}});
  for (Family f : {Family::DeepseekV2, Family::DeepseekV3})
    expect_rows(f, {{"model.layers.5.self_attn.kv_a_proj_with_mqa.weight_scale_inv",
                     "model.layers.5.self_attn.kv_a_proj_with_mqa.weight_scale_inv",
                     "self_attn.kv_a_proj_with_mqa.weight_scale_inv", -1},
                    {"model.layers.5.mlp.shared_experts.gate_proj.weight_scale_inv",
                     "model.layers.5.mlp.shared_experts.gate_proj.weight_scale_inv",
                     "mlp.shared_experts.gate_proj.weight_scale_inv", -1},
                    {"model.layers.5.mlp.experts.255.gate_proj.weight_scale_inv",
                     "model.layers.5.mlp.experts.255.gate_proj.weight_scale_inv",
                     "mlp.experts.gate_proj_weight_scale_inv", 255}});
  // Names of one family are not another's.
  EXPECT_FALSE(match_scale_key(Family::Qwen3Moe, "model.layers.1.block_sparse_moe.experts.7.w2.input_scale"));
  EXPECT_FALSE(match_scale_key(Family::Mixtral, "model.layers.1.mlp.experts.up_gate_proj.activation_scale"));
  for (Family f : {Family::Qwen3Moe, Family::Qwen2Moe, Family::Mixtral, Family::DeepseekV2, Family::DeepseekV3,
                   Family::Ernie45Moe})
    EXPECT_FALSE(scale_map(f).empty());
}

TEST(LoaderScales, PaddingTo128Bytes) {
  for (int64_t n : {1, 5, 31, 32, 33, 100}) {
    const ScaleTensor s = pad_scale(vec(n, 1.f));
    EXPECT_EQ(s.valid_shape, (Shape{n}));
    EXPECT_EQ(s.data.nbytes() % kScaleAlignBytes, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data.raw()) % kScaleAlignBytes, 0u);
    EXPECT_GE(s.data.numel(), n);
    EXPECT_LT(s.data.numel(), n + 32);
    for (int64_t i = 0; i < s.data.numel(); ++i) EXPECT_EQ(s.data.data<float>()[i], i < n ? 1.f + i : 0.f);
  }
  const ScaleTensor m = pad_scale(Tensor::zeros({3, 40}, DType::BF16));
  EXPECT_EQ(m.data.shape(), (Shape{3, 64}));  // every row starts 128-byte aligned
}

// A tiny ERNIE checkpoint (the fixture plus FastDeploy-named scales on layer 1).
class ErnieScales : public ::testing::Test {
 protected:
  void SetUp() override { write({}); }
  void write(const std::function<void(Tensors&)>& edit) {
    const std::string src = test::fixtures_dir() + "/ernie4_5_moe";
    auto file = SafetensorsFile::open(src + "/model.safetensors");
    Tensors ts;
    for (const TensorInfo& info : file->tensors()) ts.emplace_back(info.name, file->view(info.name).clone());
    const std::string L = "model.layers.1.";
    for (const char* m : {"qkv_proj", "o_proj", "cachek_matmul", "cachev_matmul", "q_matmul", "s_matmul"})
      ts.emplace_back(L + "self_attn." + m + ".activation_scale", scalar(0.5f));
    ts.emplace_back(L + "mlp.shared_experts.up_gate_proj.activation_scale", scalar(0.25f));
    ts.emplace_back(L + "mlp.shared_experts.down_proj.activation_scale", scalar(0.125f));
    ts.emplace_back(L + "mlp.experts.up_gate_proj.activation_scale", scalar(3.f));
    for (int e = 0; e < 12; ++e) {
      ts.emplace_back(L + "mlp.experts." + std::to_string(e) + ".down_proj.activation_scale", scalar(10.f + e));
      ts.emplace_back(L + "mlp.experts." + std::to_string(e) + ".up_gate_proj.weight_scale", vec(32, 100.f * e));
    }
    if (edit) edit(ts);
    write_safetensors(dir.path() + "/model.safetensors", ts);
    std::ifstream in(src + "/config.json");
    std::ofstream(dir.path() + "/config.json") << in.rdbuf();
  }
  test::TempDir dir;
};

TEST_F(ErnieScales, LoadsThisRanksExpertsPaddedWithOneSharedUpGateScale) {
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  const LayerScales s = load_layer_scales(ck, cfg, 1, 3, 6);
  const ScaleTensor* attn = s.find("self_attn.attn.cache_k_scale");
  ASSERT_TRUE(attn);
  EXPECT_EQ(attn->data.data<float>()[0], 0.5f);
  EXPECT_TRUE(s.find("self_attn.qkv_proj.act_scale") && s.find("self_attn.attn.s_scale"));
  EXPECT_EQ(s.find("mlp.shared_experts.up_gate_proj.act_scale")->data.data<float>()[0], 0.25f);
  const ScaleTensor* shared = s.find("mlp.experts.up_gate_proj_in_scale");
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->valid_shape, (Shape{1}));
  EXPECT_EQ(shared->data.data<float>()[0], 3.f);
  const ScaleTensor* down = s.find("mlp.experts.down_proj_in_scale");
  ASSERT_TRUE(down);
  EXPECT_EQ(down->valid_shape, (Shape{3}));  // experts 3, 4, 5 as local 0, 1, 2
  EXPECT_EQ(down->data.shape(), (Shape{32}));  // padded to 0x80 bytes
  EXPECT_EQ(down->data.nbytes(), 0x80u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(down->data.data<float>()[i], i < 3 ? 13.f + i : 0.f);
  const ScaleTensor* wg = s.find("mlp.experts.up_gate_proj_weight_scale");
  ASSERT_TRUE(wg);
  EXPECT_EQ(wg->valid_shape, (Shape{3, 32}));
  EXPECT_EQ(wg->data.data<float>()[32 + 1], 400.f + 1);
  // Nothing of the other experts' scales was read.
  for (int e : {0, 1, 2, 6, 11}) {
    Checkpoint fresh = Checkpoint::open(dir.path());
    load_layer_scales(fresh, cfg, 1, 3, 6);
    const uint64_t read = fresh.bytes_touched();
    fresh.view("model.layers.1.mlp.experts." + std::to_string(e) + ".down_proj.activation_scale");
    EXPECT_EQ(fresh.bytes_touched(), read + 4) << e;  // new bytes: it had not been read
  }
  // The scale keys are part of the family's name map: not unexpected, even with --strict.
  EXPECT_TRUE(unexpected_mlp_tensors(ck, cfg, 1).empty());
  MlpLoadOptions strict;
  strict.strict = true;
  EXPECT_NO_THROW(load_moe_layer(ck, cfg, 1, strict));
}

TEST_F(ErnieScales, PerExpertCopiesOfTheSharedScaleMustAgree) {
  write([](Tensors& ts) {
    std::erase_if(ts, [](const auto& p) { return p.first == "model.layers.1.mlp.experts.up_gate_proj.activation_scale"; });
    for (int e = 0; e < 12; ++e)
      ts.emplace_back("model.layers.1.mlp.experts." + std::to_string(e) + ".up_gate_proj.activation_scale",
                      scalar(e == 7 ? 9.f : 3.f));
  });
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  EXPECT_EQ(load_layer_scales(ck, cfg, 1, 0, 6).find("mlp.experts.up_gate_proj_in_scale")->data.data<float>()[0], 3.f);
  try {
    load_layer_scales(ck, cfg, 1, 6, 12);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.7.up_gate_proj.activation_scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shared by all experts"), std::string::npos) << e.what();
  }
}

TEST_F(ErnieScales, MissingPerExpertScaleNamesIt) {
  write([](Tensors& ts) {
    std::erase_if(ts, [](const auto& p) { return p.first == "model.layers.1.mlp.experts.4.down_proj.activation_scale"; });
  });
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  EXPECT_NO_THROW(load_layer_scales(ck, cfg, 1, 6, 12));  // not this rank's expert
  try {
    load_layer_scales(ck, cfg, 1, 0, 6);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.4.down_proj.activation_scale"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe
