// The tensor-parallel loader rules of every parameter family (FastDeploy's v1 loader,
// the seed 002), each checked against a whole-weight reference: the test slices the
// whole checkpoint tensor itself, by the rule this file states, and compares it with
// what the loader gives each rank of --tp 2.
//   RMSNorm (input / post-attention / final, q_a / kv_a norms)   whole on every rank
//   attention qk_norm (Qwen3 q_norm / k_norm)                     whole on every rank
//   column-parallel linear (q/k/v, q_b, kv_b) and its bias       rows of this rank's heads
//                                                                 (the bias's output_dim too)
//   row-parallel linear (o_proj)                                  columns; its bias on rank 0,
//                                                                 zeros elsewhere (added once)
//   replicated linear (MLA q_a, kv_a), embeddings, lm_head        whole (moe-ep computes the
//                                                                 logits on every rank)
//   shared experts (the replicated whitelist)                     whole on every MoE-TP rank
//   routed experts                                                their I slice
//   dense MLP layers                                              whole
//   fused qkv_proj (FastDeploy int8, [in, out])                   this rank's heads of each
//                                                                 block q, k, v
//   MTP layers (DeepSeek-V3 num_nextn_predict_layers)             skipped, with a message
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loader/checkpoint.h"
#include "loader/inventory.h"
#include "loader/moe_weights.h"
#include "loader/quant_weights.h"
#include "loader/safetensors.h"
#include "loader/shard.h"
#include "model/attention.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/weights.h"
#include "moe/fused_moe.h"
#include "runtime/generate.h"
#include "test_model_util.h"
#include "test_quant_formats_util.h"
#include "test_util.h"

namespace moe {
namespace {

constexpr int kTp = 2;

Tensor whole(const Checkpoint& ck, const std::string& key) { return ck.view(key).to(DType::F32); }

// Elements [b, e) of dim `dim` of a contiguous f32 tensor, as the test computes it.
Tensor slice_dim(const Tensor& w, int dim, int64_t b, int64_t e) {
  Shape s = w.shape();
  int64_t outer = 1, after = 1;
  for (int d = 0; d < dim; ++d) outer *= s[d];
  for (size_t d = dim + 1; d < s.size(); ++d) after *= s[d];
  const int64_t n = s[dim];
  s[dim] = e - b;
  Tensor out = Tensor::empty(s, DType::F32);
  float* o = out.data<float>();
  for (int64_t i = 0; i < outer; ++i)
    for (int64_t j = b; j < e; ++j)
      for (int64_t a = 0; a < after; ++a) *o++ = w.data<float>()[(i * n + j) * after + a];
  return out;
}

// This rank's 1/kTp of dim `dim`.
Tensor rank_part(const Tensor& w, int dim, int r) {
  const int64_t n = w.dim(dim);
  return slice_dim(w, dim, r * n / kTp, (r + 1) * n / kTp);
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Tensor g = got.to(DType::F32);
  EXPECT_EQ(0, std::memcmp(g.raw(), want.raw(), want.nbytes())) << what;
}

enum class Want { Whole, Rows, Cols, BiasOnce };

// The rule this test states for each attention / model key (by the key's module name).
Want expected_rule(const std::string& key) {
  auto ends = [&](const char* s) { return key.ends_with(s); };
  const bool col = key.find("q_proj.") != std::string::npos || key.find("k_proj.") != std::string::npos ||
                   key.find("v_proj.") != std::string::npos || key.find("q_b_proj.") != std::string::npos ||
                   key.find("kv_b_proj.") != std::string::npos;
  if (col) return Want::Rows;  // weight [out, in] rows and bias [out] alike: the bias's output_dim
  if (key.find("o_proj.") != std::string::npos) return ends(".bias") ? Want::BiasOnce : Want::Cols;
  return Want::Whole;  // norms, qk_norm, q_a / kv_a, embeddings, lm_head
}

void check_reads_against_whole(const std::string& fixture) {
  SCOPED_TRACE(fixture);
  const Checkpoint ck = Checkpoint::open(test::fixtures_dir() + "/" + fixture);
  const ModelConfig c = model_config_from_hf(ck.config());
  std::map<std::string, Tensor> bias_sum;  // row-parallel biases summed over the ranks
  int seen_norm = 0, seen_col_bias = 0, seen_qk_norm = 0, seen_lm_head = 0;
  for (int r = 0; r < kTp; ++r)
    for (const TensorRead& t : model_reads(c, r, kTp)) {
      const Tensor got = load_f32(ck, t), w = whole(ck, t.key);
      switch (expected_rule(t.key)) {
        case Want::Whole: expect_same(got, w, t.key); break;
        case Want::Rows: expect_same(got, rank_part(w, 0, r), t.key); break;
        case Want::Cols: expect_same(got, rank_part(w, 1, r), t.key); break;
        case Want::BiasOnce:
          if (r == 0) expect_same(got, w, t.key);
          else expect_same(got, Tensor::zeros(w.shape(), DType::F32), t.key);
          break;
      }
      seen_norm += t.key.find("norm") != std::string::npos;
      seen_qk_norm += t.key.ends_with("q_norm.weight") || t.key.ends_with("k_norm.weight");
      seen_col_bias += expected_rule(t.key) == Want::Rows && t.key.ends_with(".bias");
      seen_lm_head += t.key.starts_with("lm_head");
    }
  EXPECT_GT(seen_norm, 0);
  if (c.qk_norm) {
    EXPECT_GT(seen_qk_norm, 0);
  }
  if (fixture == "qwen2_moe") {
    EXPECT_EQ(seen_col_bias, 3 * kTp * c.n_layers);  // q/k/v biases
  }
  if (!c.tie_embeddings) {
    EXPECT_EQ(seen_lm_head, kTp);
  }
}

TEST(TpRules, AttentionNormsAndLmHeadAgainstTheWholeWeight) {
  // qwen3_moe: q_norm / k_norm; qwen2_moe: q/k/v biases; deepseek_v3: MLA with q-LoRA;
  // deepseek_v2: MLA without; ernie4_5_moe: tied embeddings.
  for (const char* f : {"qwen3_moe", "qwen2_moe", "deepseek_v3", "deepseek_v2", "ernie4_5_moe"})
    check_reads_against_whole(f);
}

// No fixture has an o_proj bias: a row-parallel linear with a bias, written here.
TEST(TpRules, RowParallelBiasIsAddedOnceAndSumsToTheWhole) {
  test::TempDir d;
  Tensor w = test::random_f32({6, 8}, 1.f, 5), b = test::random_f32({6}, 1.f, 6);
  std::ofstream(d / "config.json") << "{}";
  write_safetensors(d / "model.safetensors", {{"m.o_proj.weight", w}, {"m.o_proj.bias", b}});
  const Checkpoint ck = Checkpoint::open(d.path());
  Tensor sum = Tensor::zeros({6}, DType::F32);
  for (int r = 0; r < kTp; ++r) {
    const LinearRead lr = linear_read("m.o_proj", 6, 8, true, {Split::Row, r, kTp});
    expect_same(load_f32(ck, lr.weight), rank_part(w, 1, r), "weight");
    const Tensor bias = load_f32(ck, *lr.bias);
    for (int64_t i = 0; i < 6; ++i) sum.data<float>()[i] += bias.data<float>()[i];
  }
  expect_same(sum, b, "the bias summed over the ranks");  // exactly: zeros elsewhere, no division
  for (int r = 0; r < kTp; ++r) {  // column-parallel: the bias follows its weight's rows
    const LinearRead lr = linear_read("m.o_proj", 6, 8, true, {Split::Column, r, kTp});
    expect_same(load_f32(ck, lr.weight), rank_part(w, 0, r), "column weight");
    expect_same(load_f32(ck, *lr.bias), rank_part(b, 0, r), "column bias");
  }
}

// A FastDeploy fused qkv_proj [in, out] = [q | k | v] columns: each rank holds its heads of
// each block (q, k and v differ in size: a window per block, then the rank's part of it).
TEST(TpRules, FusedQkvBlocksAreSlicedPerBlock) {
  test::TempDir d;
  const int64_t H = 4, nq = 8, nkv = 4, out = nq + 2 * nkv;
  Tensor w = test::random_f32({H, out}, 1.f, 7), s = test::random_f32({out}, 1.f, 8);
  Tensor o = test::random_f32({nq, H}, 1.f, 9), os = test::random_f32({H}, 1.f, 10);
  std::ofstream(d / "config.json") << "{}";
  write_safetensors(d / "model.safetensors", {{"model.layers.0.self_attn.qkv_proj.weight", w},
                                              {"model.layers.0.self_attn.qkv_proj.weight_scale", s},
                                              {"model.layers.0.self_attn.o_proj.weight", o},
                                              {"model.layers.0.self_attn.o_proj.weight_scale", os}});
  const Checkpoint ck = Checkpoint::open(d.path());
  const int64_t blocks[3][2] = {{0, nq}, {nq, nkv}, {nq + nkv, nkv}};
  for (int r = 0; r < kTp; ++r) {
    for (const auto& [b, n] : blocks) {
      Int8LinearSpec sp{0, "self_attn.qkv_proj", H, out, Int8LinearSpec::Column, r, kTp, b, n};
      const Int8LinearRead rd = int8_linear_read(sp);
      const int64_t lo = b + r * n / kTp, hi = b + (r + 1) * n / kTp;
      expect_same(load_f32(ck, rd.weight), slice_dim(w, 1, lo, hi), rd.weight.rule.describe());
      expect_same(load_f32(ck, rd.weight_scale), slice_dim(s, 0, lo, hi), rd.weight_scale.rule.describe());
      // One rank: the whole block.
      sp.size = 1;
      sp.rank = 0;
      expect_same(load_f32(ck, int8_linear_read(sp).weight), slice_dim(w, 1, b, b + n), "one rank");
    }
    const Int8LinearRead ro = int8_linear_read({0, "self_attn.o_proj", nq, H, Int8LinearSpec::Row, r, kTp});
    expect_same(load_f32(ck, ro.weight), rank_part(o, 0, r), "o_proj [in, out]: rows of the input dim");
    expect_same(load_f32(ck, ro.weight_scale), os, "o_proj's scales: every output channel on every rank");
  }
}

// The shared experts under MoE-TP: the whitelist keeps them whole (the MoE block runs
// them sequence-parallel), while the routed experts get their I slice and a dense MLP
// layer stays whole.
TEST(TpRules, SharedExpertsStayWholeUnderMoeTp) {
  // Rules before the whitelist: what the whitelist has to undo.
  EXPECT_EQ(apply_whitelist("model.layers.1.mlp.shared_experts.up_proj.weight", ShardRule::column(),
                            moe_replicated_whitelist()).kind,
            ShardKind::Replicated);
  EXPECT_EQ(apply_whitelist("model.layers.1.mlp.shared_expert_gate.weight", ShardRule::column(),
                            moe_replicated_whitelist()).kind,
            ShardKind::Replicated);
  EXPECT_EQ(apply_whitelist("model.layers.1.mlp.experts.3.up_proj.weight", ShardRule::column(),
                            moe_replicated_whitelist()).kind,
            ShardKind::Column);
  for (const char* fixture : {"qwen2_moe", "deepseek_v3", "ernie4_5_moe"}) {
    SCOPED_TRACE(fixture);
    const Checkpoint ck = Checkpoint::open(test::fixtures_dir() + "/" + fixture);
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    int64_t moe_layer = -1, dense_layer = -1;
    for (int64_t l = 0; l < cfg.n_layers; ++l) (cfg.is_moe_layer(l) ? moe_layer : dense_layer) = l;
    ASSERT_GE(moe_layer, 0);
    const int64_t I = cfg.moe_intermediate_size;
    int shared_seen = 0;
    for (int r = 0; r < kTp; ++r) {
      MlpLoadOptions o;
      o.tp_rank = r;
      o.tp_size = kTp;
      for (const LayerRead& rd : mlp_layer_reads(ck, cfg, moe_layer, o)) {
        const Tensor got = load_sharded(ck, rd.tensor_read(), DType::F32), w = whole(ck, rd.key);
        switch (rd.role) {
          case LayerRead::Shared:
          case LayerRead::SharedGate: ++shared_seen; [[fallthrough]];
          case LayerRead::Router:
          case LayerRead::Bias: expect_same(got, w, rd.key); break;
          case LayerRead::ExpertGate:
          case LayerRead::ExpertUp: expect_same(got, slice_dim(w, 0, r * I / kTp, (r + 1) * I / kTp), rd.key); break;
          case LayerRead::ExpertDown: expect_same(got, slice_dim(w, 1, r * I / kTp, (r + 1) * I / kTp), rd.key); break;
          default: ADD_FAILURE() << "unexpected role for " << rd.key;
        }
      }
      if (dense_layer >= 0)
        for (const LayerRead& rd : mlp_layer_reads(ck, cfg, dense_layer, o))
          expect_same(load_sharded(ck, rd.tensor_read(), DType::F32), whole(ck, rd.key), rd.key);
    }
    EXPECT_GE(shared_seen, 3 * kTp);
    // The loaded layers: every MoE-TP rank's shared experts give the one-rank output.
    MoeLayer one(cfg, load_moe_layer(ck, cfg, moe_layer, {}));
    const Tensor x = test::random_f32({5, cfg.hidden_size}, 1.f, 11);
    Tensor y1 = Tensor::zeros({5, cfg.hidden_size}, DType::F32);
    one.shared_experts(x, y1.data<float>(), false);
    for (int r = 0; r < kTp; ++r) {
      MlpLoadOptions o;
      o.tp_rank = r;
      o.tp_size = kTp;
      MoeLayer part(cfg, load_moe_layer(ck, cfg, moe_layer, o));
      Tensor yr = Tensor::zeros({5, cfg.hidden_size}, DType::F32);
      part.shared_experts(x, yr.data<float>(), false);
      EXPECT_EQ(0, std::memcmp(yr.raw(), y1.raw(), y1.nbytes())) << "rank " << r;
    }
  }
}

// DeepSeek-V3's MTP layers (num_nextn_predict_layers) are not loaded, and the load says
// so; the checks count their keys as known. Keys of layers past them are reported.
TEST(TpRules, MtpLayersAreSkippedWithAMessage) {
  const std::string fx = "deepseek_v3";
  test::Tensors ts = test::fixture_tensors(fx);
  const size_t n0 = ts.size();
  for (size_t i = 0; i < n0; ++i)  // layer 3 = a copy of layer 2, plus the MTP projections
    if (ts[i].first.starts_with("model.layers.2."))
      ts.emplace_back("model.layers.3." + ts[i].first.substr(15), ts[i].second.clone());
  ts.emplace_back("model.layers.3.enorm.weight", Tensor::zeros({32}, DType::F32));
  ts.emplace_back("model.layers.3.hnorm.weight", Tensor::zeros({32}, DType::F32));
  ts.emplace_back("model.layers.3.eh_proj.weight", Tensor::zeros({32, 64}, DType::F32));
  auto write = [&](const test::TempDir& d, int64_t nextn) {
    std::ifstream in(test::fixtures_dir() + "/" + fx + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["num_nextn_predict_layers"] = nextn;
    std::ofstream(d / "config.json") << j.dump();
    write_safetensors(d / "model.safetensors", ts);
  };
  test::TempDir with, without;
  write(with, 1);
  write(without, 0);
  {
    const Checkpoint ck = Checkpoint::open(with.path());
    const ModelConfig c = model_config_from_hf(ck.config());
    EXPECT_EQ(c.moe.n_mtp_layers, 1);
    EXPECT_FALSE(mtp_layer_keys(ck, c.moe).empty());
    for (const auto& p : check_checkpoint(ck, c.moe, model_reads(c, 0, 1)))
      EXPECT_EQ(p.key.find("model.layers.3."), std::string::npos) << p.message;
    testing::internal::CaptureStderr();
    auto m = test::load_model(with.path());
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("skipping 1 MTP layer"), std::string::npos) << err;
    EXPECT_NE(err.find("model.layers.3"), std::string::npos) << err;
    EXPECT_NE(err.find("not loaded"), std::string::npos) << err;
    // The decoder itself is the fixture's: the same logits.
    auto ref = test::load_model(test::fixtures_dir() + "/" + fx);
    const std::vector<std::vector<int32_t>> prompt = {{3, 1, 4}};
    const Tensor a = prefill_logits(*m, prompt), b = prefill_logits(*ref, prompt);
    EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes()));
  }
  {
    const Checkpoint ck = Checkpoint::open(without.path());
    const ModelConfig c = model_config_from_hf(ck.config());
    bool flagged = false;
    for (const auto& p : check_checkpoint(ck, c.moe, model_reads(c, 0, 1)))
      flagged = flagged || (p.kind == TensorProblem::Unexpected && p.key.starts_with("model.layers.3."));
    EXPECT_TRUE(flagged);
    testing::internal::CaptureStderr();
    test::load_model(without.path());
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("past num_hidden_layers=3"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace moe
