// W8A8 MoE layers: against a plain per-slot reference that quantises the same way, batch
// and ISA invariance, the fixtures against the f32 path (cosine >= 0.99), the CLI's
// --quantize w8a8, and bad smooth tables.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "kernels/quant.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/fused_moe.h"
#include "test_quant_util.h"
#include "test_util.h"

namespace moe {
namespace {

// y = sum_j w_j * W2_e(Q(act(W13_e Q(x / s1_e)) / s2_e)), every GEMM by grouped_gemm_reference
// on a single row, summed in slot order in f32 like moe::combine.
Tensor w8a8_reference(MoeLayer& layer, const Tensor& x) {
  const MoeConfig& cfg = layer.config();
  const MoeLayerWeights& w = layer.weights();
  const int64_t T = x.dim(0), H = cfg.hidden_size, I = w.w13.n_out(), k = cfg.top_k, E_l = w.n_local();
  Routing r;
  layer.route(x, r);
  const Tensor xf = x.to(DType::F32);
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  std::vector<char> a(q8_row_bytes(H)), b(q8_row_bytes(I));
  std::vector<float> h(I), o(H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = r.ids[t * k + j] - w.expert_begin;
      std::vector<int64_t> off(E_l + 1, 0);
      for (int64_t i = e + 1; i <= E_l; ++i) off[i] = 1;
      const float* s1 = w.w13.smooth.defined() ? w.w13.smooth.data<float>() + e * H : nullptr;
      const float* s2 = w.w2.smooth.defined() ? w.w2.smooth.data<float>() + e * I : nullptr;
      quantize_row_q8_reference(xf.data<float>() + t * H, s1, H, a.data());
      GroupedGemmParams g;
      g.w = &w.w13;
      g.a = a.data();
      g.lda = q8_row_bytes(H);
      g.offsets = off.data();
      g.c = h.data();
      g.ldc = I;
      g.act = cfg.act;
      grouped_gemm_reference(g);
      quantize_row_q8_reference(h.data(), s2, I, b.data());
      g.w = &w.w2;
      g.a = b.data();
      g.lda = q8_row_bytes(I);
      g.c = o.data();
      g.ldc = H;
      g.act = Activation::None;
      grouped_gemm_reference(g);
      const float wt = r.weights[t * k + j];
      for (int64_t c = 0; c < H; ++c) y.data<float>()[t * H + c] += wt * o[c];
    }
  return y;
}

TEST(QuantLayer, MatchesPerSlotReferenceBitwise) {
  for (bool smooth : {false, true}) {
    const MoeConfig cfg = test::w8a8_config(72, 40, 8, 3);
    MoeLayer layer(cfg, test::w8a8_layer(cfg, 0, 8, smooth));
    EXPECT_EQ(layer.smooth_uniform(), !smooth);
    for (int64_t T : {1, 5, 40}) {
      const Tensor x = test::seeded({T, 72}, 1.f, 77 + T);
      const Tensor y = layer.forward(x);
      const Tensor ref = w8a8_reference(layer, x);
      EXPECT_TRUE(test::all_close(y, ref, {1e-6, 1e-2})) << "smooth " << smooth << " T=" << T;
      EXPECT_EQ(0, std::memcmp(y.raw(), ref.raw(), y.nbytes())) << "smooth " << smooth << " T=" << T;
    }
  }
}

TEST(QuantLayer, BatchInvariantAndExactOnEveryIsa) {
  const MoeConfig cfg = test::w8a8_config(64, 48, 6, 2, 32);
  MoeLayer layer(cfg, test::w8a8_layer(cfg, 0, 6, true));
  const Tensor x = test::seeded({37, 64}, 1.f, 3).to(DType::BF16);
  const Tensor full = layer.forward(x);
  for (int64_t n : {1, 2, 5, 11}) {
    for (int64_t r0 = 0; r0 + n <= 37; r0 += 9) {
      const Tensor part = layer.forward(x.slice_rows(r0, r0 + n).clone());
      ASSERT_EQ(0, std::memcmp(part.raw(), static_cast<const float*>(full.raw()) + r0 * 64, part.nbytes()))
          << "rows [" << r0 << ", " << r0 + n << ")";
    }
  }
  // Every ISA: the layer equals the per-slot reference bit for bit (the router's f32 GEMM
  // is not ISA-invariant, so each ISA is compared with the reference under that ISA; the
  // bf16 shared experts are left out for the same reason).
  const MoeConfig cfg2 = test::w8a8_config(64, 48, 6, 2);
  MoeLayer routed(cfg2, test::w8a8_layer(cfg2, 0, 6, true));
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}) {
    set_isa_cap(isa);
    const Tensor y = routed.forward(x);
    const Tensor ref = w8a8_reference(routed, x);
    EXPECT_EQ(0, std::memcmp(y.raw(), ref.raw(), y.nbytes())) << isa_name(isa);
  }
  set_isa_cap(kTopIsa);
}

TEST(QuantLayer, BadSmoothTablesAreErrors) {
  const MoeConfig cfg = test::w8a8_config(32, 16, 4, 2);
  {  // local experts have smooth vectors, the table of all experts is missing
    MoeLayerWeights w = test::w8a8_layer(cfg, 0, 4, true);
    w.smooth_all = Tensor();
    EXPECT_THROW(MoeLayer(cfg, std::move(w)), Error);
  }
  {  // the table misses experts
    MoeLayerWeights w = test::w8a8_layer(cfg, 0, 4, true);
    w.smooth_all = w.smooth_all.slice_rows(0, 3).clone();
    EXPECT_THROW(MoeLayer(cfg, std::move(w)), Error);
  }
  {  // the table disagrees with an expert's own smooth vector
    MoeLayerWeights w = test::w8a8_layer(cfg, 0, 4, true);
    w.smooth_all.data<float>()[2 * 32 + 5] *= 2.f;
    EXPECT_THROW(MoeLayer(cfg, std::move(w)), Error);
  }
}

struct MoeCase {
  std::string name, dir, input, output;
  int64_t layer, tokens;
};

std::vector<MoeCase> moe_cases() {
  std::vector<MoeCase> out;
  for (const auto& f : test::manifest())
    for (const auto& c : f["cases"]) {
      if (c["kind"] != "moe" || c["tokens"].get<int64_t>() == 0) continue;
      out.push_back({f["name"], test::fixtures_dir() + "/" + f["name"].get<std::string>(),
                     test::fixtures_dir() + "/" + c["input"].get<std::string>(),
                     test::fixtures_dir() + "/" + c["output"].get<std::string>(), c["layer"], c["tokens"]});
    }
  return out;
}

// Every fixture's MoE layers: W8A8 routed experts (router and shared experts f32) against
// the f32 path: cosine similarity of the layer outputs >= 0.99 (the bound).
TEST(QuantLayer, FixturesCosineVsF32) {
  int n = 0;
  double worst = 1;
  for (const MoeCase& c : moe_cases()) {
    Checkpoint ck = Checkpoint::open(c.dir);
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    const Tensor x = SafetensorsFile::open(c.input)->view("hidden_states").clone();
    MlpLoadOptions lo;
    lo.compute = DType::F32;
    MoeLayer f32(cfg, load_moe_layer(ck, cfg, c.layer, lo));
    lo.quantize_w8a8 = true;
    MoeLayer q8(cfg, load_moe_layer(ck, cfg, c.layer, lo));
    ASSERT_TRUE(q8.quantized());
    ASSERT_FALSE(f32.quantized());
    const double cs = test::cosine(q8.forward(x), f32.forward(x));
    std::printf("[ w8a8     ] %-16s layer %ld T=%-3ld cosine vs f32 %.6f\n", c.name.c_str(), long(c.layer),
                long(c.tokens), cs);
    EXPECT_GE(cs, 0.99) << c.name << " layer " << c.layer << " T=" << c.tokens;
    worst = std::min(worst, cs);
    ++n;
  }
  std::printf("[ w8a8     ] %d cases, worst cosine %.6f\n", n, worst);
  EXPECT_GT(n, 10);
}

TEST(QuantLayer, CliQuantizeW8a8MatchesTheApi) {
  test::TempDir tmp;
  int n = 0;
  for (const MoeCase& c : moe_cases()) {
    if (c.tokens != 7) continue;
    const std::string out = tmp / "out.safetensors";
    std::string log;
    const int rc = test::run_command(std::string(MOE_EP_BINARY) + " layer --quiet --model " + c.dir + " --layer " +
                                         std::to_string(c.layer) + " --input " + c.input + " --output " + out +
                                         " --dtype bf16 --quantize w8a8",
                                     &log);
    ASSERT_EQ(rc, 0) << log;
    Checkpoint ck = Checkpoint::open(c.dir);
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    MlpLoadOptions lo;
    lo.compute = DType::BF16;
    lo.quantize_w8a8 = true;
    MoeLayer q8(cfg, load_moe_layer(ck, cfg, c.layer, lo));
    const Tensor x = SafetensorsFile::open(c.input)->view("hidden_states").clone();
    const Tensor want = q8.forward(x);
    const Tensor got = SafetensorsFile::open(out)->view("hidden_states").clone();
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes())) << c.name;
    ++n;
  }
  EXPECT_GT(n, 3);
}

}  // namespace
}  // namespace moe
