// The fused MoE layer against the plain reference, over many shapes, dtypes,
// activations, routing variants and instruction sets.
#include <gtest/gtest.h>

#include "core/cpu.h"
#include <cstring>
#include "kernels/routing.h"
#include "moe/fused_moe.h"
#include "moe/reference.h"
#include "test_util.h"

namespace moe {
namespace {

struct LayerCase {
  int64_t H, I, E, k, T;
  Activation act;
  int64_t shared_I;
  bool shared_gate;
  RoutingConfig routing;
};

MoeLayerWeights random_layer(const LayerCase& c, DType dt, uint64_t seed) {
  MoeLayerWeights w;
  w.expert_begin = 0;
  w.expert_end = c.E;
  w.gate = make_packed_experts(1, c.E, c.H, DType::F32, false);
  pack_expert(w.gate, 0, test::random_f32({c.E, c.H}, 1.f, seed));
  w.w13 = make_packed_experts(c.E, 2 * c.I, c.H, dt, true);
  w.w2 = make_packed_experts(c.E, c.H, c.I, dt, false);
  for (int64_t e = 0; e < c.E; ++e) {
    pack_expert(w.w13, e, test::random_bf16_exact({2 * c.I, c.H}, 1.f / std::sqrt(float(c.H)), seed + 1 + 2 * e));
    pack_expert(w.w2, e, test::random_bf16_exact({c.H, c.I}, 1.f / std::sqrt(float(c.I)), seed + 2 + 2 * e));
  }
  if (c.routing.use_correction_bias) w.correction_bias = test::random_f32({c.E}, 0.3f, seed + 999);
  if (c.shared_I > 0) {
    GatedMlpWeights s;
    s.act = c.act;
    s.w13 = make_packed_experts(1, 2 * c.shared_I, c.H, dt, true);
    s.w2 = make_packed_experts(1, c.H, c.shared_I, dt, false);
    pack_expert(s.w13, 0, test::random_bf16_exact({2 * c.shared_I, c.H}, 1.f / std::sqrt(float(c.H)), seed + 77));
    pack_expert(s.w2, 0, test::random_bf16_exact({c.H, c.shared_I}, 1.f / std::sqrt(float(c.shared_I)), seed + 78));
    w.shared = std::move(s);
    if (c.shared_gate) w.shared_gate = test::random_f32({c.H}, 0.3f, seed + 79);
  }
  return w;
}

MoeConfig config_of(const LayerCase& c) {
  MoeConfig cfg;
  cfg.model_type = "test";
  cfg.n_layers = 1;
  cfg.hidden_size = c.H;
  cfg.moe_intermediate_size = c.I;
  cfg.n_experts = c.E;
  cfg.top_k = c.k;
  cfg.act = c.act;
  cfg.routing = c.routing;
  cfg.shared_intermediate_size = c.shared_I;
  cfg.shared_expert_gate = c.shared_gate;
  return cfg;
}

std::vector<LayerCase> layer_cases() {
  RoutingConfig softmax_renorm;
  softmax_renorm.renormalize = true;
  RoutingConfig v3;
  v3.scoring = Scoring::Sigmoid;
  v3.use_correction_bias = true;
  v3.n_group = 4;
  v3.topk_group = 2;
  v3.group_score = GroupScore::SumTop2;
  v3.renormalize = true;
  v3.scaling = 2.5f;
  RoutingConfig plain;
  return {
      {32, 16, 8, 2, 7, Activation::SiluMul, 0, false, softmax_renorm},
      {40, 24, 60, 4, 33, Activation::SiluMul, 0, false, softmax_renorm},
      {32, 20, 6, 2, 1, Activation::SiluMul, 40, true, plain},
      {32, 16, 32, 8, 19, Activation::SiluMul, 16, false, v3},
      {48, 17, 12, 3, 64, Activation::GeluTanhMul, 32, false, plain},
      {33, 9, 5, 1, 5, Activation::GeluErfMul, 0, false, softmax_renorm},
      {128, 96, 16, 8, 130, Activation::SiluMul, 64, false, v3},
      {64, 48, 8, 2, 0, Activation::SiluMul, 0, false, softmax_renorm},
  };
}

class FusedMoeVsReference : public ::testing::TestWithParam<std::tuple<DType, Isa>> {};

TEST_P(FusedMoeVsReference, ManyShapes) {
  const auto [dt, isa] = GetParam();
  set_isa_cap(isa);
  uint64_t seed = 1;
  for (const LayerCase& c : layer_cases()) {
    SCOPED_TRACE(::testing::Message() << "H=" << c.H << " I=" << c.I << " E=" << c.E << " k=" << c.k
                                      << " T=" << c.T);
    const MoeConfig cfg = config_of(c);
    MoeLayer layer(cfg, random_layer(c, dt, seed));
    const Tensor x = test::random_bf16_exact({c.T, c.H}, 1.f, seed + 5000);
    const Tensor ref = moe_reference(cfg, layer.weights(), x);
    const Tensor y = layer.forward(x);
    // The reference rounds at the same places as the kernels, so f32 summation order
    // is the only difference for both dtypes; bf16 also gets the vLLM bound in case
    // an intermediate value lands on a rounding boundary.
    EXPECT_TRUE(test::all_close(y, ref, dt == DType::F32 ? test::kF32Tol : test::kBf16Tol));
    // bf16 input rows give the same result as f32 rows holding the same values.
    const Tensor yb = layer.forward(x.to(DType::BF16));
    EXPECT_TRUE(test::all_close(yb, y, {1e-6, 1e-6}));
    seed += 100;
  }
  set_isa_cap(kTopIsa);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, FusedMoeVsReference,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(Isa::Portable, Isa::Avx2, Isa::Avx512,
                                                              Isa::Avx512Bf16, Isa::Amx)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

TEST(FusedMoe, RejectsWrongInputShape) {
  LayerCase c{32, 16, 8, 2, 3, Activation::SiluMul, 0, false, {}};
  MoeLayer layer(config_of(c), random_layer(c, DType::F32, 3));
  EXPECT_THROW(layer.forward(test::random_f32({3, 31}, 1.f, 1)), Error);
  try {
    layer.forward(test::random_f32({3, 31}, 1.f, 1));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_states"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

// EP invariance rests on this: a row's GEMM result must not depend on which other
// rows share its expert in the call (the decode kernel for <= 4 rows and the
// register-blocked prefill kernel must accumulate in the same order).
TEST(GroupedGemmBatchInvariance, RowResultIndependentOfBatch) {
  for (DType dt : {DType::F32, DType::BF16})
    for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}) {
      set_isa_cap(isa);
      const int64_t K = 301, N = 2 * 40, rows = 70;
      PackedExperts w = make_packed_experts(1, N, K, dt, true);
      pack_expert(w, 0, test::random_f32({N, K}, 0.1f, 3));
      const Tensor a = test::random_f32({rows, K}, 1.f, 4).to(dt);
      Tensor full = Tensor::zeros({rows, N / 2}, DType::F32);
      GroupedGemmParams p;
      p.w = &w;
      p.a = a.raw();
      p.lda = K;
      p.c_dtype = DType::F32;
      p.ldc = N / 2;
      p.act = Activation::SiluMul;
      const int64_t all[2] = {0, rows};
      p.offsets = all;
      p.c = full.raw();
      grouped_gemm(p);
      for (int64_t batch : {1, 2, 3, 5, 7, 13}) {
        for (int64_t r0 = 0; r0 + batch <= rows; r0 += 11) {
          Tensor part = Tensor::zeros({rows, N / 2}, DType::F32);
          const int64_t some[2] = {r0, r0 + batch};
          p.offsets = some;
          p.c = part.raw();
          grouped_gemm(p);
          ASSERT_EQ(0, std::memcmp(static_cast<const float*>(part.raw()) + r0 * (N / 2),
                                   static_cast<const float*>(full.raw()) + r0 * (N / 2), batch * (N / 2) * 4))
              << dtype_name(dt) << " " << isa_name(isa) << " rows [" << r0 << ", " << r0 + batch << ")";
        }
      }
    }
  set_isa_cap(kTopIsa);
}

// The expert load a layer counts from its own routing (count_routed, what generate and
// serve report) equals an independent recount: router logits in double from the
// unpacked gate, routed by route_reference, their ids counted.
TEST(FusedMoeLoadCounts, EqualAnIndependentRecount) {
  uint64_t seed = 500;
  for (const LayerCase& c : layer_cases()) {
    if (c.T == 0) continue;
    seed += 100;
    const MoeConfig cfg = config_of(c);
    MoeLayer layer(cfg, random_layer(c, DType::F32, seed));
    const Tensor gate = test::random_f32({c.E, c.H}, 1.f, seed);  // as random_layer packs it
    const Tensor bias = c.routing.use_correction_bias ? test::random_f32({c.E}, 0.3f, seed + 999) : Tensor();
    std::vector<int64_t> counts(c.E, 0), recount(c.E, 0);
    layer.count_routed(counts.data());
    for (uint64_t i = 0; i < 2; ++i) {
      const Tensor x = test::random_f32({c.T, c.H}, 1.f, seed + 50 + i);
      layer.forward(x);
      std::vector<float> logits(c.T * c.E), w(c.T * c.k);
      std::vector<int32_t> ids(c.T * c.k);
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t e = 0; e < c.E; ++e) {
          double d = 0;
          for (int64_t h = 0; h < c.H; ++h) d += double(x.data<float>()[t * c.H + h]) * gate.data<float>()[e * c.H + h];
          logits[t * c.E + e] = static_cast<float>(d);
        }
      RoutingParams rp;
      rp.cfg = c.routing;
      rp.n_tokens = c.T;
      rp.n_experts = c.E;
      rp.top_k = c.k;
      rp.logits = logits.data();
      rp.correction_bias = bias.defined() ? bias.data<float>() : nullptr;
      rp.weights = w.data();
      rp.ids = ids.data();
      route_reference(rp);
      for (int32_t e : ids) ++recount[e];
    }
    layer.count_routed(nullptr);
    layer.forward(test::random_f32({c.T, c.H}, 1.f, seed + 60));  // not counted any more
    EXPECT_EQ(counts, recount) << "H=" << c.H << " E=" << c.E << " k=" << c.k << " T=" << c.T;
    int64_t total = 0;
    for (int64_t n : counts) total += n;
    EXPECT_EQ(total, 2 * c.T * c.k);
  }
}

}  // namespace
}  // namespace moe
