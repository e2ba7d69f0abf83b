// FP8 block-scaled checkpoints (DeepSeek-V3 style: F8_E4M3 weights + weight_scale_inv per
// block): loaded by dequantising each expert to bf16 at load, bit-exact against
// dequantize_fp8_blocks; the layer close to the f32 layer; bad blocks/scales are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "kernels/quant.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/fused_moe.h"
#include "test_quant_util.h"
#include "test_util.h"

namespace moe {
namespace {

// Nearest e4m3 code of v (brute force over the finite codes; ties to the lower code).
uint8_t to_e4m3(float v) {
  uint8_t best = 0;
  float bd = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float d = std::fabs(f8e4m3_to_f32(static_cast<uint8_t>(c)) - v);
    if (d < bd) {
      bd = d;
      best = static_cast<uint8_t>(c);
    }
  }
  return best;
}

// Writes an FP8 copy of the deepseek_v3 fixture into dir: layer `layer`'s MLP weights
// ("*_proj.weight") as F8_E4M3 + "<key>_scale_inv" f32 [n/bn, k/bk]. scale_rows_extra
// adds rows to every scale (a wrong shape).
void write_fp8_fixture(const std::string& dir, int64_t layer, int64_t bn, int64_t bk, int64_t cfg_bn,
                       int scale_rows_extra = 0) {
  const std::string src = test::fixtures_dir() + "/deepseek_v3";
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {cfg_bn, bk}}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  auto f = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> out;
  const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.";
  for (const TensorInfo& ti : f->tensors()) {
    const Tensor t = f->view(ti.name).to(DType::F32);
    const bool quant = ti.name.starts_with(prefix) && ti.name.ends_with("_proj.weight");
    if (!quant) {
      out.push_back({ti.name, f->view(ti.name).clone()});
      continue;
    }
    const int64_t n = t.dim(0), k = t.dim(1);
    Tensor q = Tensor::empty({n, k}, DType::F8E4M3);
    Tensor s = Tensor::zeros({n / bn + scale_rows_extra, k / bk}, DType::F32);
    for (int64_t bi = 0; bi < n / bn; ++bi)
      for (int64_t bj = 0; bj < k / bk; ++bj) {
        float amax = 0;
        for (int64_t i = bi * bn; i < (bi + 1) * bn; ++i)
          for (int64_t j = bj * bk; j < (bj + 1) * bk; ++j) amax = std::max(amax, std::fabs(t.data<float>()[i * k + j]));
        const float sc = amax > 0 ? amax / 448.f : 1.f;
        s.data<float>()[bi * (k / bk) + bj] = sc;
        for (int64_t i = bi * bn; i < (bi + 1) * bn; ++i)
          for (int64_t j = bj * bk; j < (bj + 1) * bk; ++j)
            static_cast<uint8_t*>(q.raw())[i * k + j] = to_e4m3(t.data<float>()[i * k + j] / sc);
      }
    out.push_back({ti.name, q});
    out.push_back({ti.name + "_scale_inv", s});
  }
  write_safetensors(dir + "/model.safetensors", out);
}

TEST(QuantFp8, BlockScaledCheckpointLoadsBitExactAndCloseToF32) {
  test::TempDir tmp;
  write_fp8_fixture(tmp.path(), 1, 8, 16, 8);
  Checkpoint ck = Checkpoint::open(tmp.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  MlpLoadOptions lo;
  lo.compute = DType::F32;
  MoeLayer fp8(cfg, load_moe_layer(ck, cfg, 1, lo));
  // f32 compute: packed weights == dequantize_fp8_blocks of the stored tensors, the exact
  // f32 products (what transformers computes with), bit for bit.
  for (int64_t e : {0, 7, 31}) {
    const std::string base = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    auto deq = [&](const std::string& p) {
      return dequantize_fp8_blocks(ck.view(base + p + ".weight"), ck.view(base + p + ".weight_scale_inv"), 8, 16,
                                   DType::F32);
    };
    const Tensor g = deq("gate_proj"), u = deq("up_proj"), d = deq("down_proj");
    const Tensor w13 = unpack_expert(fp8.weights().w13, e), w2 = unpack_expert(fp8.weights().w2, e);
    EXPECT_EQ(0, std::memcmp(w13.raw(), g.raw(), g.nbytes())) << e;
    EXPECT_EQ(0, std::memcmp(static_cast<const char*>(w13.raw()) + g.nbytes(), u.raw(), u.nbytes())) << e;
    EXPECT_EQ(0, std::memcmp(w2.raw(), d.raw(), d.nbytes())) << e;
  }
  // The layer against the f32 checkpoint's: fp8 weights, so only close.
  Checkpoint ref_ck = Checkpoint::open(test::fixtures_dir() + "/deepseek_v3");
  MoeLayer f32(cfg, load_moe_layer(ref_ck, cfg, 1, lo));
  const Tensor x = test::seeded({9, 32}, 1.f, 4);
  const double cs = test::cosine(fp8.forward(x), f32.forward(x));
  std::printf("[ fp8      ] deepseek_v3 layer 1, fp8 e4m3 blocks [8, 16]: cosine vs f32 %.6f\n", cs);
  EXPECT_GE(cs, 0.99);
  // And W8A8 on top of it loads too.
  lo.quantize_w8a8 = true;
  MoeLayer q8(cfg, load_moe_layer(ck, cfg, 1, lo));
  EXPECT_GE(test::cosine(q8.forward(x), f32.forward(x)), 0.99);
}

// With bf16 compute the routed and shared experts stay e4m3 in memory and the GEMM
// dequantises them panel by panel: the layer equals, bit for bit, the same layer with
// the weights dequantised to bf16 at load, and the experts take half the memory.
TEST(QuantFp8, Bf16ComputeKeepsE4m3AndEqualsDequantisedAtLoad) {
  test::TempDir tmp;
  write_fp8_fixture(tmp.path(), 1, 8, 16, 8);
  Checkpoint ck = Checkpoint::open(tmp.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  MlpLoadOptions lo;
  lo.compute = DType::BF16;
  MoeLayer fp8(cfg, load_moe_layer(ck, cfg, 1, lo));
  ASSERT_EQ(fp8.weights().w13.dtype, DType::F8E4M3);
  ASSERT_EQ(fp8.weights().w2.dtype, DType::F8E4M3);
  ASSERT_TRUE(fp8.weights().shared.has_value());
  EXPECT_EQ(fp8.weights().shared->w13.dtype, DType::F8E4M3);
  EXPECT_EQ(fp8.compute_dtype(), DType::BF16);

  auto to_bf16 = [](const PackedExperts& p) {
    PackedExperts b = make_packed_experts(p.n_experts, p.n, p.k, DType::BF16, p.gated);
    for (int64_t e = 0; e < p.n_experts; ++e) pack_expert(b, e, unpack_expert(p, e));  // bf16-exact values
    return b;
  };
  MoeLayerWeights at_load = fp8.weights();
  at_load.w13 = to_bf16(fp8.weights().w13);
  at_load.w2 = to_bf16(fp8.weights().w2);
  at_load.shared->w13 = to_bf16(fp8.weights().shared->w13);
  at_load.shared->w2 = to_bf16(fp8.weights().shared->w2);
  EXPECT_EQ(fp8.weights().w13.data.nbytes() * 2, at_load.w13.data.nbytes());
  MoeLayer deq(cfg, std::move(at_load));
  for (int64_t T : {1, 3, 40}) {
    const Tensor x = test::seeded({T, 32}, 1.f, 10 + T);
    const Tensor a = fp8.forward(x), b = deq.forward(x);
    ASSERT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << "T=" << T;
  }
  Checkpoint ref_ck = Checkpoint::open(test::fixtures_dir() + "/deepseek_v3");
  lo.compute = DType::F32;
  MoeLayer f32(cfg, load_moe_layer(ref_ck, cfg, 1, lo));
  const Tensor x = test::seeded({9, 32}, 1.f, 4);
  const double cs = test::cosine(fp8.forward(x), f32.forward(x));
  std::printf("[ fp8      ] deepseek_v3 layer 1, e4m3 kept, bf16 compute: cosine vs f32 %.6f\n", cs);
  EXPECT_GE(cs, 0.99);
}

TEST(QuantFp8, BadBlocksAndScalesAreClearErrors) {
  for (DType compute : {DType::F32, DType::BF16}) {
  MlpLoadOptions lo;
  lo.compute = compute;
  {
    // weight_block_size [7, 16] on [16, 32] weights: partial edge blocks are legal, so the
    // scales must have ceil(16 / 7) = 3 rows; the stored 2 are a clear error.
    test::TempDir tmp;
    write_fp8_fixture(tmp.path(), 1, 8, 16, 7);
    Checkpoint ck = Checkpoint::open(tmp.path());
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    try {
      load_moe_layer(ck, cfg, 1, lo);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has shape [2, 2], expected [3, 2]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("_scale_inv"), std::string::npos) << e.what();
    }
  }
  {
    test::TempDir tmp;  // scales with an extra row
    write_fp8_fixture(tmp.path(), 1, 8, 16, 8, 1);
    Checkpoint ck = Checkpoint::open(tmp.path());
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    try {
      load_moe_layer(ck, cfg, 1, lo);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has shape [3, 2], expected [2, 2]"), std::string::npos) << e.what();
    }
  }
  }
}

}  // namespace
}  // namespace moe
