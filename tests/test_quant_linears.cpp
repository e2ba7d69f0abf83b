// W8A8 dense projections (ModelOptions::quantize_linears, `--quantize-linears w8a8`):
// attention q/k/v/o (MLA q_a/q_b/kv_a/o) and lm_head hold int8 weights with one scale per
// output channel and quantise each input row with its own absmax.
//   * linear_forward on an I8 Linear is exactly the scalar W8A8 reference (the row
//     quantiser's definition, then grouped_gemm_reference's integer sums) on every ISA,
//     bias included, and close to the f32 projection;
//   * whole models, every fixture, with W8A8 experts as well: the prefill logits keep the
//     W8A8 issue's bound (cosine >= 0.99 vs fp32 at every position) except where a
//     routing decision flips (test_quant_model_util.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/quant.h"
#include "model/layers.h"
#include "model/model.h"
#include "test_isa.h"
#include "test_quant_model_util.h"

namespace moe {
namespace {

Tensor gaussian(const Shape& s, uint32_t seed) {
  Tensor t = Tensor::empty(s, DType::F32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

TEST(QuantLinear, I8ProjectionIsTheScalarW8A8ReferenceOnEveryIsa) {
  for (const auto& [n, k, T] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{96, 64, 1}, {130, 301, 7}, {64, 2048, 3}}) {
    const Tensor w = gaussian({n, k}, 1 + n), x = gaussian({T, k}, 2 + k), bias = gaussian({n}, 3);
    const Linear lq = make_linear(w, DType::I8, bias), lf = make_linear(w, DType::F32, bias);
    ASSERT_EQ(lq.w.dtype, DType::I8);
    // The reference: each row through the scalar quantiser, the integer GEMM, then the bias.
    const int64_t rb = q8_row_bytes(k);
    std::vector<char> q(static_cast<size_t>(T * rb));
    for (int64_t t = 0; t < T; ++t) quantize_row_q8_reference(x.data<float>() + t * k, nullptr, k, q.data() + t * rb);
    std::vector<float> want(static_cast<size_t>(T * n));
    const int64_t off[2] = {0, T};
    GroupedGemmParams g;
    g.w = &lq.w;
    g.a = q.data();
    g.lda = rb;
    g.offsets = off;
    g.c = want.data();
    g.ldc = n;
    grouped_gemm_reference(g);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n; ++j) want[t * n + j] += bias.data<float>()[j];
    std::vector<float> yf(static_cast<size_t>(T * n));
    LinearScratch s;
    linear_forward(lf, x.data<float>(), T, yf.data(), s);
    for (Isa isa : test::available_isas()) {
      test::IsaScope scope(isa);
      std::vector<float> got(static_cast<size_t>(T * n));
      linear_forward(lq, x.data<float>(), T, got.data(), s);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << isa_name(isa) << " n=" << n << " k=" << k << " T=" << T;
      // Per-channel and per-token absmax steps err by at most half a step each (~0.4 % of
      // a Gaussian row's absmax / 127 scale): the output keeps a cosine near 0.9999.
      EXPECT_GT(test::cosine(got.data(), yf.data(), T * n), 0.999) << "n=" << n << " k=" << k;
    }
  }
}

std::unique_ptr<Model> load(const std::string& dir, bool quantized) {
  ModelOptions o;
  o.quantize_w8a8 = quantized;
  o.quantize_linears = quantized;
  o.n_slots = 3;
  o.max_seq = 32;
  return Model::load(dir, o);
}

class QuantLinearsModel : public ::testing::TestWithParam<test::ModelFixture> {};

TEST_P(QuantLinearsModel, PrefillLogitsCosineVsFp32) {
  const test::ModelFixture& f = GetParam();
  auto fp = load(f.dir, false), q8 = load(f.dir, true);
  const Tensor lf = prefill_logits(*fp, f.prompts), lq = prefill_logits(*q8, f.prompts);
  ASSERT_EQ(lq.shape(), lf.shape());
  const test::CosineBound b = test::check_prefill_cosines(*fp, *q8, f.prompts, lf, lq);
  for (const std::string& flip : b.flips) std::printf("[ w8a8 linears ] %-16s %s\n", f.name.c_str(), flip.c_str());
  // Flips stay rare: at most one position per fixture, as with W8A8 experts alone.
  EXPECT_LE(b.flips.size(), 1u);
  EXPECT_GT(test::max_logit_diff(lq, lf, f.prompts), 0.0);  // the projections really ran in int8
  std::printf("[ w8a8 linears ] %-16s worst cosine %.6f over %d positions (%.6f without routing flips)\n",
              f.name.c_str(), b.worst, b.positions, b.worst_same_routing);
}

std::string fixture_name(const ::testing::TestParamInfo<test::ModelFixture>& i) { return i.param.name; }
INSTANTIATE_TEST_SUITE_P(Fixtures, QuantLinearsModel, ::testing::ValuesIn(test::model_fixtures()), fixture_name);

}  // namespace
}  // namespace moe
