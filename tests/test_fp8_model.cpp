// FP8 block-scaled checkpoints outside the MLP blocks and under tensor parallelism
// (loader/fp8_weights.h): every TP slice of every kind of weight equals the same slice
// of the whole dequantised weight, computed here from the raw codes and scales; linear
// layers keep the codes in bf16 mode and equal the bf16 kernel on the dequantised
// weights; quantization_config is parsed strictly; hostile FP8 checkpoints are clear
// errors naming the tensor. (The whole-model goldens from transformers on the FP8
// fixtures run in test_model.cpp and tests/mpi/test_model.cpp, which take every
// fixture of the manifest.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include "kernels/quant.h"
#include "loader/checkpoint.h"
#include "loader/fp8_weights.h"
#include "loader/quant_config.h"
#include "model/layers.h"
#include "model/model.h"
#include "test_model_util.h"
#include "test_mutate.h"
#include "test_util.h"

namespace moe {
namespace {

using nlohmann::json;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The whole weight of an FP8 tensor, dequantised from the file's codes and scales by the
// definition (e4m3 value x the scale of its [bn, bk] block, partial edge blocks), f32.
Tensor whole_dequantised(const Checkpoint& ck, const std::string& key, int64_t bn, int64_t bk) {
  const Tensor c = ck.view(key).clone();
  const Tensor s = ck.view(key + "_scale_inv").to(DType::F32);
  const int64_t nd = c.ndim(), n = c.dim(nd - 2), k = c.dim(nd - 1), E = nd == 3 ? c.dim(0) : 1;
  const int64_t sn = s.dim(nd - 2), sk = s.dim(nd - 1);
  EXPECT_EQ(sn, (n + bn - 1) / bn) << key;
  EXPECT_EQ(sk, (k + bk - 1) / bk) << key;
  Tensor out = Tensor::empty(c.shape(), DType::F32);
  const auto* q = static_cast<const uint8_t*>(c.raw());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        out.data<float>()[(e * n + i) * k + j] =
            f8e4m3_to_f32(q[(e * n + i) * k + j]) * s.data<float>()[(e * sn + i / bn) * sk + j / bk];
  return out;
}

// Rows or columns of `w` ([.., n, k]) a TP rank holds, written out by hand: dim `dim`
// (-2 rows, -1 columns) is `parts` stacked blocks, each cut in `size` equal pieces.
Tensor slice_by_hand(const Tensor& w, int dim, int parts, int rank, int size) {
  const int64_t nd = w.ndim(), n = w.dim(nd - 2), k = w.dim(nd - 1), E = nd == 3 ? w.dim(0) : 1;
  const int64_t len = dim == -2 ? n : k, block = len / parts, piece = block / size;
  std::vector<int64_t> keep;
  for (int q = 0; q < parts; ++q)
    for (int64_t i = 0; i < piece; ++i) keep.push_back(q * block + rank * piece + i);
  const int64_t n2 = dim == -2 ? static_cast<int64_t>(keep.size()) : n, k2 = dim == -1 ? static_cast<int64_t>(keep.size()) : k;
  Shape sh = w.shape();
  sh[nd - 2] = n2;
  sh[nd - 1] = k2;
  Tensor out = Tensor::empty(sh, DType::F32);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < n2; ++i)
      for (int64_t j = 0; j < k2; ++j) {
        const int64_t si = dim == -2 ? keep[i] : i, sj = dim == -1 ? keep[j] : j;
        out.data<float>()[(e * n2 + i) * k2 + j] = w.data<float>()[(e * n + si) * k + sj];
      }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Fp8Slices, IndexMapsFollowTheShardRules) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(shard_index_map("w", {8, 4}, ShardRule::column(), 1, 2, 0), (V{4, 5, 6, 7}));
  EXPECT_EQ(shard_index_map("w", {8, 4}, ShardRule::column(), 1, 2, 1), (V{0, 1, 2, 3}));
  EXPECT_EQ(shard_index_map("w", {8, 4}, ShardRule::column(0, 2), 1, 2, 0), (V{2, 3, 6, 7}));
  EXPECT_EQ(shard_index_map("w", {8, 6}, ShardRule::row(), 2, 3, 1), (V{4, 5}));
  EXPECT_EQ(shard_index_map("w", {8, 6}, ShardRule::replicated(), 2, 3, 1), (V{0, 1, 2, 3, 4, 5}));
  // Stacked experts [E, 2I, H]: experts [2, 4), then gate/up rows of MoE-TP rank 0 of 2.
  const ShardRule st = ShardRule::expert_local_stacked(2, 4, 0, 2);
  EXPECT_EQ(shard_index_map("w", {5, 8, 3}, st, 0, 2, 0), (V{2, 3}));
  EXPECT_EQ(shard_index_map("w", {5, 8, 3}, st, 0, 2, 1), (V{0, 1, 4, 5}));
  EXPECT_EQ(shard_index_map("w", {5, 8, 3}, st, 0, 2, 2), (V{0, 1, 2}));
  // A window of rows (the vocabulary-parallel lm_head's [V_r, H]): the rows of the window,
  // also when the window is then split; the other dim whole. plan_shard reads the same rows.
  EXPECT_EQ(shard_index_map("w", {10, 4}, ShardRule::column().window(3, 4), 0, 1, 0), (V{3, 4, 5, 6}));
  EXPECT_EQ(shard_index_map("w", {10, 4}, ShardRule::column().window(3, 4), 1, 2, 0), (V{5, 6}));
  EXPECT_EQ(shard_index_map("w", {10, 4}, ShardRule::column().window(3, 4), 0, 1, 1), (V{0, 1, 2, 3}));
  EXPECT_EQ(plan_shard("w", {10, 4}, ShardRule::column().window(3, 4), 0, 1).out_shape, (Shape{4, 4}));
  EXPECT_THROW(shard_index_map("w", {10, 4}, ShardRule::column().window(8, 4), 0, 1, 0), Error);
}

struct SliceCase {
  std::string fixture, key;
  ShardRule rule;
  int dim, parts;  // what the rule cuts, for slice_by_hand (dim 0: nothing)
  std::vector<int> sizes;
};

// Every kind of slice the model makes of a weight: column-parallel q/k/v, q_b, kv_b;
// row-parallel o_proj; MoE-TP's I slice of per-expert gate (rows) and down (columns),
// and of the stacked gate_up (two parts) and down; block boundaries cut mid-block.
TEST(Fp8Slices, EveryTpSliceIsTheWholeWeightsSlice) {
  const std::vector<SliceCase> cases = {
      {"deepseek_v3_fp8", "model.layers.0.self_attn.q_b_proj.weight", ShardRule::column(), -2, 1, {2, 4}},
      {"deepseek_v3_fp8", "model.layers.0.self_attn.kv_b_proj.weight", ShardRule::column(), -2, 1, {2, 4}},
      {"deepseek_v3_fp8", "model.layers.1.self_attn.o_proj.weight", ShardRule::row(), -1, 1, {2, 4}},
      {"deepseek_v3_fp8", "model.layers.1.mlp.experts.3.gate_proj.weight", ShardRule::expert_local(0), -2, 1, {2, 4}},
      {"deepseek_v3_fp8", "model.layers.1.mlp.experts.3.down_proj.weight", ShardRule::expert_local(1), -1, 1, {2, 4}},
      {"qwen3_moe_fp8", "model.layers.0.self_attn.k_proj.weight", ShardRule::column(), -2, 1, {2}},
      {"qwen3_moe_fp8", "model.layers.0.self_attn.o_proj.weight", ShardRule::row(), -1, 1, {2, 4}},
      {"qwen3_moe_fp8", "model.layers.0.mlp.experts.5.down_proj.weight", ShardRule::expert_local(1), -1, 1, {2, 3}},
      {"mixtral_fused_fp8", "model.layers.0.mlp.experts.gate_up_proj", ShardRule::expert_local_stacked(2, 6, 0, 2), -2,
       2, {1, 2, 3}},
      {"mixtral_fused_fp8", "model.layers.0.mlp.experts.down_proj", ShardRule::expert_local_stacked(2, 6, 1), -1, 1,
       {1, 2, 3}},
      {"mixtral_fused_fp8", "model.layers.1.self_attn.o_proj.weight", ShardRule::row(), -1, 1, {2, 4}},
  };
  int checked = 0;
  for (const SliceCase& c : cases) {
    Checkpoint ck = Checkpoint::open(test::fixtures_dir() + "/" + c.fixture);
    const auto [bn, bk] = fp8_block_shape(ck);
    ASSERT_EQ(ck.info(c.key).dtype, DType::F8E4M3) << c.key;
    const Shape full = ck.info(c.key).shape;
    Tensor whole = whole_dequantised(ck, c.key, bn, bk);
    const bool stacked = c.rule.expert_end >= 0;
    if (stacked) whole = whole.slice_rows(c.rule.expert_begin, c.rule.expert_end).clone();
    for (int size : c.sizes)
      for (int r = 0; r < size; ++r) {
        SCOPED_TRACE(fmt::format("{} {} rank {} of {}", c.fixture, c.key, r, size));
        const TensorRead rd{c.key, full, c.rule, r, size};
        const Tensor want = slice_by_hand(whole, c.dim, c.parts, r, size);
        const Fp8Slice s = load_fp8_slice(ck, rd);
        EXPECT_EQ(s.block_k % 2, 0);
        EXPECT_EQ(s.cols() % s.block_k, 0);
        EXPECT_TRUE(same_bits(dequantize_fp8(s, DType::F32), want)) << "f32 dequantisation of the slice";
        // Packed e4m3 (bf16 compute): the kernel's values are the slice's, rounded to bf16.
        const int64_t E = stacked ? s.codes.dim(0) : 1, n = s.rows(), k = s.cols();
        PackedExperts p = make_packed_fp8(E, n, k, /*gated=*/false, s.block_k);
        for (int64_t e = 0; e < E; ++e) pack_fp8(p, e, s, stacked ? e : -1);
        for (int64_t e = 0; e < E; ++e) {
          const Tensor got = unpack_expert(p, e);
          for (int64_t i = 0; i < n * k; ++i)
            ASSERT_EQ(got.data<float>()[i], round_bf16(want.data<float>()[e * n * k + i])) << "expert " << e << " @" << i;
        }
        ++checked;
      }
  }
  EXPECT_EQ(checked, 61);
}

// bf16 compute keeps an attention projection's codes (1 byte per weight) and gives the
// bf16 kernel's result on the dequantised weights, bit for bit; f32 compute gives the
// f32 kernel on the exact dequantised weights.
TEST(Fp8Linears, KeepCodesAndEqualTheFloatKernelOnDequantisedWeights) {
  Checkpoint ck = Checkpoint::open(test::fixtures_dir() + "/deepseek_v3_fp8");
  const std::string prefix = "model.layers.0.self_attn.q_a_proj";
  const Shape full = ck.info(prefix + ".weight").shape;  // [24, 32]
  const LinearRead rd = linear_read(prefix, full[0], full[1], false);
  const Tensor whole = whole_dequantised(ck, prefix + ".weight", 16, 16);
  const Tensor x = test::random_f32({5, full[1]}, 1.f, 3);
  for (DType dt : {DType::BF16, DType::F32}) {
    const Linear l = load_linear(ck, rd, dt);
    EXPECT_EQ(l.w.dtype, dt == DType::BF16 ? DType::F8E4M3 : DType::F32);
    const Linear ref = make_linear(whole, dt);
    Tensor y = Tensor::zeros({5, full[0]}, DType::F32), y_ref = Tensor::zeros({5, full[0]}, DType::F32);
    LinearScratch s;
    linear_forward(l, x.data<float>(), 5, y.data<float>(), s);
    linear_forward(ref, x.data<float>(), 5, y_ref.data<float>(), s);
    EXPECT_TRUE(same_bits(y, y_ref)) << dtype_name(dt);
  }
}

TEST(Fp8Config, QuantizationConfigIsParsedStrictly) {
  auto cfg = [](json q) { return json{{"quantization_config", q}}; };
  EXPECT_FALSE(parse_quant_config(json::object()).fp8());
  const QuantConfig q = parse_quant_config(cfg({{"quant_method", "fp8"},
                                                {"fmt", "e4m3"},
                                                {"activation_scheme", "dynamic"},
                                                {"weight_block_size", {64, 32}},
                                                {"modules_to_not_convert", {"lm_head", "mlp.gate"}},
                                                {"ignored_layers", {"model.layers.3.self_attn.o_proj"}}}));
  EXPECT_TRUE(q.fp8());
  EXPECT_EQ(q.block_n, 64);
  EXPECT_EQ(q.block_k, 32);
  EXPECT_TRUE(q.ignores("lm_head"));
  EXPECT_TRUE(q.ignores("model.layers.0.mlp.gate"));
  EXPECT_FALSE(q.ignores("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(q.ignores("model.layers.0.mlp.experts.3.gate_proj"));
  EXPECT_TRUE(q.ignores("model.layers.3.self_attn.o_proj"));
  EXPECT_FALSE(q.ignores("model.layers.13.self_attn.o_proj"));
  EXPECT_EQ(module_of("a.b.q_proj.weight"), "a.b.q_proj");
  EXPECT_EQ(module_of("a.experts.gate_up_proj"), "a.experts.gate_up_proj");
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"quant_method", "bitsandbytes"}}, "quant_method \"bitsandbytes\" is not supported"},
      {{{"quant_method", "fp8"}, {"fmt", "e5m2"}}, "fmt \"e5m2\" is not supported"},
      {{{"quant_method", "fp8"}, {"activation_scheme", "static"}}, "activation_scheme \"static\""},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128}}}, "weight_block_size must be [rows, cols]"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {0, 128}}}, "must be positive"},
      {{{"quant_method", "fp8"}, {"modules_to_not_convert", "lm_head"}}, "must be a list"},
      {{{"quant_method", "fp8"}, {"ignored_layers", {1}}}, "module names (strings)"},
      {{{"bits", 4}}, "no quant_method"},
      {json::array(), "must be an object"},
  };
  for (const auto& [q2, want] : bad) {
    const std::string msg = error_of([&] { parse_quant_config(cfg(q2)); });
    EXPECT_NE(msg.find(want), std::string::npos) << q2.dump() << ": " << msg;
  }
}

// Hostile FP8 checkpoints: each is an error naming the tensor (and its scales) when the
// model loads, never a crash or a silent wrong load.
TEST(Fp8Hostile, ClearErrorsNamingTheTensor) {
  const std::string attn = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";
  struct Case {
    const char* what;
    std::function<void(test::Tensors&)> tensors;
    std::function<void(json&)> config;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"scale shape", [&](test::Tensors& ts) { *test::find_tensor(ts, attn + "_scale_inv") = Tensor::zeros({1, 2}, DType::F32); },
       {}, {attn, "weight_scale_inv", "has shape [1, 2], expected [2, 2]"}},
      {"missing scales",
       [&](test::Tensors& ts) {
         std::erase_if(ts, [&](const auto& kv) { return kv.first == attn + "_scale_inv"; });
       },
       {}, {attn, "has no block scales"}},
      {"NaN scale", [&](test::Tensors& ts) { test::find_tensor(ts, attn + "_scale_inv")->data<float>()[1] = NAN; }, {},
       {attn, "block scale nan"}},
      {"Inf scale",
       [&](test::Tensors& ts) { test::find_tensor(ts, "model.layers.1.mlp.experts.2.up_proj.weight_scale_inv")->data<float>()[0] = INFINITY; },
       {}, {"model.layers.1.mlp.experts.2.up_proj.weight", "block scale inf"}},
      {"NaN code", [&](test::Tensors& ts) { static_cast<uint8_t*>(test::find_tensor(ts, attn)->raw())[7] = 0x7f; }, {},
       {attn, "NaN code 0x7f"}},
      {"unknown method", {}, [](json& c) { c["quantization_config"]["quant_method"] = "bitsandbytes"; },
       {"quant_method \"bitsandbytes\" is not supported"}},
      {"block size", {}, [](json& c) { c["quantization_config"]["weight_block_size"] = {8, 16}; },
       {"weight_scale_inv", "expected"}},
      {"listed as not converted", {},
       [](json& c) { c["quantization_config"]["modules_to_not_convert"] = {"kv_a_proj_with_mqa"}; },
       {attn, "lists its module"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    test::TempDir d;
    test::mutate_fixture("deepseek_v3_fp8", d.path(), c.tensors, c.config);
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string msg = error_of([&] { test::load_model(d.path(), dt); });
      ASSERT_FALSE(msg.empty()) << "no error (" << dtype_name(dt) << ")";
      for (const std::string& w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
    }
  }
}

// A row-parallel slice that cuts a scale block at an odd offset cannot be computed (the
// GEMM's k pairs share one scale): a clear error naming the tensor and its block.
TEST(Fp8Hostile, OddBlockCutByTheTpSliceIsAnError) {
  test::TempDir d;
  Tensor w = Tensor::zeros({4, 6}, DType::F8E4M3), s = Tensor::zeros({1, 2}, DType::F32);
  s.data<float>()[0] = s.data<float>()[1] = 1.f;
  write_safetensors(d / "model.safetensors", {{"lin.weight", w}, {"lin.weight_scale_inv", s}});
  std::ofstream(d / "config.json") << json{{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {4, 4}}}}}.dump();
  Checkpoint ck = Checkpoint::open(d.path());
  EXPECT_EQ(fp8_slice_block_k(ck, {"lin.weight", {4, 6}, ShardRule::replicated()}), 2);  // gcd(4, 0, 6)
  const std::string msg = error_of([&] { fp8_slice_block_k(ck, {"lin.weight", {4, 6}, ShardRule::row(), 1, 2}); });
  EXPECT_NE(msg.find("'lin.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("odd widths"), std::string::npos) << msg;
}

}  // namespace
}  // namespace moe
