// Grouped GEMM: packing round trips, the fast kernels against the scalar reference under
// every ISA level this CPU has, and the reference against an independent float64 model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "test_isa.h"

namespace moe {
namespace {

using test::IsaScope;
using test::available_isas;

Tensor random_tensor(const Shape& shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

float read_elem(const void* base, DType dt, int64_t i) {
  return dt == DType::F32 ? static_cast<const float*>(base)[i] : bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

TEST(GroupedGemmPack, RoundTripF32AndBf16) {
  struct S {
    int64_t n, k;
    bool gated;
  };
  for (S s : {S{2, 1, true}, S{32, 16, true}, S{48, 40, true}, S{1536, 33, true}, S{130, 7, false},
              S{64, 1, false}, S{40, 24, false}, S{1, 3, false}}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      PackedExperts p = make_packed_experts(3, s.n, s.k, dt, s.gated);
      std::vector<Tensor> ws;
      for (int e = 0; e < 3; ++e) {
        ws.push_back(random_tensor({s.n, s.k}, 100 + e));
        pack_expert(p, e, ws.back());
      }
      for (int e = 0; e < 3; ++e) {
        Tensor u = unpack_expert(p, e);
        ASSERT_EQ(u.shape(), (Shape{s.n, s.k}));
        const float* a = ws[e].data<float>();
        const float* b = u.data<float>();
        for (int64_t i = 0; i < s.n * s.k; ++i) {
          const float want = dt == DType::F32 ? a[i] : round_bf16(a[i]);
          ASSERT_EQ(std::memcmp(&want, &b[i], 4), 0) << "n=" << s.n << " k=" << s.k << " i=" << i;
        }
      }
    }
  }
}

TEST(GroupedGemmPack, AcceptsBf16AndF16Sources) {
  const Tensor w = random_tensor({48, 40}, 7);
  for (DType src : {DType::BF16, DType::F16}) {
    const Tensor ws = w.to(src);
    const Tensor wf = ws.to(DType::F32);  // the exact values the source holds
    PackedExperts p = make_packed_experts(1, 48, 40, DType::BF16, true);
    pack_expert(p, 0, ws);
    const Tensor u = unpack_expert(p, 0);
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_EQ(u.data<float>()[i], round_bf16(wf.data<float>()[i])) << dtype_name(src) << " i=" << i;
  }
}

TEST(GroupedGemmPack, RejectsBadShapes) {
  EXPECT_THROW(make_packed_experts(2, 3, 4, DType::F32, true), Error);  // gated needs even n
  EXPECT_THROW(make_packed_experts(2, 4, 4, DType::F16, false), Error);
  PackedExperts p = make_packed_experts(2, 4, 4, DType::F32, false);
  EXPECT_THROW(pack_expert(p, 0, random_tensor({4, 5}, 1)), Error);
  EXPECT_THROW(pack_expert(p, 2, random_tensor({4, 4}, 1)), Error);
}

// Activation functions against float64 formulas (written in their cancellation-free forms:
// 0.5 x (1 + tanh(y)) = x / (1 + exp(-2y)), 0.5 x (1 + erf(z)) = 0.5 x erfc(-z)). In the far
// negative tails the f32 argument of exp (up to ~-70) carries a relative rounding error of
// ~1e-6 that exp amplifies by |arg|, so the bound widens there (those values are < 1e-8);
// exp clamps its argument to [-87, 88], so below ~-16.5 gelu_tanh returns ~1e-37, not 0.
TEST(GroupedGemmAct, ScalarMatchesFloat64) {
  for (float g = -30.0f; g <= 30.0f; g += 0.00390625f) {
    const double x = g;
    const double silu = x / (1 + std::exp(-x));
    const double gt = x / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    const double ge = 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    const double rel = std::abs(g) <= 3 ? 1e-6 : 3e-5;
    auto near = [&](Activation a, double want) {
      const double got = act_gate(a, g);
      EXPECT_LE(std::abs(got - want), rel * std::abs(want) + 1e-35) << "act " << int(a) << " g=" << g;
    };
    near(Activation::SiluMul, silu);
    near(Activation::GeluTanhMul, gt);
    near(Activation::GeluErfMul, ge);
    EXPECT_EQ(act_gate(Activation::None, g), g);
  }
  EXPECT_EQ(parse_activation("silu"), Activation::SiluMul);
  EXPECT_EQ(parse_activation("gelu"), Activation::GeluErfMul);
  EXPECT_EQ(parse_activation("gelu_pytorch_tanh"), Activation::GeluTanhMul);
  EXPECT_EQ(parse_activation("gelu_new"), Activation::GeluTanhMul);
  EXPECT_THROW(parse_activation("relu2"), Error);
}

// The kernels' vector epilogues compute act_gate() bit for bit: with K=1, gate weight 1 and
// up weight 1 both accumulators hold exactly a, so the output must equal act_gate(a) * a.
TEST(GroupedGemmAct, EpilogueBitExactWithScalar) {
  const int64_t n_rows = 601;
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (DType dt : {DType::F32, DType::BF16}) {
      PackedExperts p = make_packed_experts(1, 2, 1, dt, true);
      Tensor w = Tensor::empty({2, 1}, DType::F32);
      w.data<float>()[0] = w.data<float>()[1] = 1.0f;
      pack_expert(p, 0, w);
      std::vector<float> g(n_rows);
      for (int64_t r = 0; r < n_rows; ++r) g[r] = round_bf16(-40.0f + 0.1337f * r);
      Tensor a = Tensor::empty({n_rows, 1}, DType::F32);
      std::memcpy(a.raw(), g.data(), n_rows * 4);
      if (dt == DType::BF16) a = a.to(DType::BF16);
      int64_t off[2] = {0, n_rows};
      for (Activation act : {Activation::SiluMul, Activation::GeluTanhMul, Activation::GeluErfMul}) {
        std::vector<float> c(n_rows, -1.0f);
        GroupedGemmParams gp;
        gp.w = &p;
        gp.a = a.raw();
        gp.lda = 1;
        gp.offsets = off;
        gp.c = c.data();
        gp.ldc = 1;
        gp.act = act;
        grouped_gemm(gp);
        for (int64_t r = 0; r < n_rows; ++r) {
          const float want = act_gate(act, g[r]) * g[r];
          ASSERT_EQ(std::memcmp(&want, &c[r], 4), 0)
              << isa_name(isa) << " " << dtype_name(dt) << " act " << int(act) << " g=" << g[r] << " got " << c[r]
              << " want " << want;
        }
      }
    }
  }
}

struct Case {
  int64_t n, k;
  bool gated;
  std::vector<int64_t> rows;  // per expert
  int64_t lda_pad = 0, ldc_pad = 0;
  int64_t row0 = 0;  // offsets[0]
};

// Everything one case needs: packed weights, unpacked copies, inputs, offsets.
struct Problem {
  Case cs;
  DType dt;
  PackedExperts w;
  std::vector<Tensor> wu;  // unpacked f32 [n, k] per expert (the exact packed values)
  Tensor a;                // [row0 + total, lda] in dt
  std::vector<int64_t> off;
  int64_t lda, ldc, total;

  Problem(const Case& c, DType d, uint32_t seed) : cs(c), dt(d) {
    const int64_t E = static_cast<int64_t>(c.rows.size());
    w = make_packed_experts(E, c.n, c.k, d, c.gated);
    for (int64_t e = 0; e < E; ++e) {
      pack_expert(w, e, random_tensor({c.n, c.k}, seed + 17 * e, 1.0f));
      wu.push_back(unpack_expert(w, e));
    }
    off.assign(E + 1, c.row0);
    for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + c.rows[e];
    total = off[E];
    lda = c.k + c.lda_pad;
    ldc = w.n_out() + c.ldc_pad;
    a = random_tensor({std::max<int64_t>(total, 1), lda}, seed + 999, 1.0f).to(d);
  }

  GroupedGemmParams params(void* c, DType c_dtype, Activation act) const {
    GroupedGemmParams p;
    p.w = &w;
    p.a = a.raw();
    p.lda = lda;
    p.offsets = off.data();
    p.c = c;
    p.c_dtype = c_dtype;
    p.ldc = ldc;
    p.act = act;
    return p;
  }

  double a_at(int64_t r, int64_t k) const { return read_elem(a.raw(), dt, r * lda + k); }

  // For output (r, col): float64 value, and the error scale sum |terms| of gate/up (or plain).
  void exact(int64_t e, int64_t r, int64_t col, Activation act, double* out, double* scale) const {
    const float* W = wu[e].data<float>();
    auto dot = [&](int64_t n, double* s_abs) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < cs.k; ++k) {
        const double t = a_at(r, k) * W[n * cs.k + k];
        s += t;
        sa += std::abs(t);
      }
      *s_abs = sa;
      return s;
    };
    if (!cs.gated) {
      *out = dot(col, scale);
      return;
    }
    double sg, su;
    const double g = dot(col, &sg), u = dot(w.n_out() + col, &su);
    double ag = g;
    switch (act) {
      case Activation::SiluMul: ag = g / (1 + std::exp(-g)); break;
      case Activation::GeluTanhMul: ag = g / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))); break;
      case Activation::GeluErfMul: ag = 0.5 * g * std::erfc(-g / std::sqrt(2.0)); break;
      case Activation::None: break;
    }
    *out = ag * u;
    // d(act(g) u) = act'(g) u dg + act(g) du, |act'| <= 1.13 for silu and both gelus.
    *scale = 1.13 * std::abs(u) * sg + std::abs(ag) * su;
  }
};

double bf16_ulp(double x) {
  int e;
  std::frexp(std::max(std::abs(x), 1e-38), &e);
  return std::ldexp(1.0, e - 8);
}

std::vector<Case> cases() {
  return {
      {32, 40, true, {0, 1, 2, 3, 5, 17}},        // I=16, H=40
      {48, 32, true, {64, 0, 3, 1, 0, 2, 5}, 3, 5},  // I=24, padded lda/ldc
      {2, 7, true, {1, 0, 5}, 1, 0, 2},           // I=1, odd k, odd lda, offsets[0] > 0
      {40, 24, false, {2, 0, 17, 1, 3}},          // W2 shape H=40, I=24
      {33, 7, false, {5, 1}, 1, 2},               // odd n, odd k
      {32, 16, false, {0, 0, 0}},                 // all empty
      {64, 1, false, {1, 2}},                     // k = 1
      {32, 1, true, {3, 6}},                      // gated, k = 1
      {130, 33, false, {7, 12}},                  // n over 2 panels + tail
      {1536, 2048, true, {1, 0, 2, 7}},           // Qwen3-30B-A3B W13
      {2048, 768, false, {3, 8, 0}},              // Qwen3-30B-A3B W2
      {96, 2048, true, {4, 1, 6}},                // I=48: half-panel tail on a long K
      {70, 301, false, {13, 50}},                 // odd K over several K chunks, row groups
  };
}

std::string describe(const Case& c, DType dt, DType cdt, Activation act, Isa isa) {
  return fmt::format("n={} k={} gated={} E={} w={} c={} act={} isa={}", c.n, c.k, c.gated, c.rows.size(),
                     dtype_name(dt), dtype_name(cdt), int(act), isa_name(isa));
}

// Fast kernels == reference (same bf16 inputs, f32 accumulation in a different order),
// under every ISA cap, for every activation and output dtype; padding of c untouched.
TEST(GroupedGemm, KernelsMatchReference) {
  const std::vector<Isa> isas = available_isas();
  uint32_t seed = 1;
  for (const Case& cs : cases()) {
    const bool big = cs.k >= 768;
    for (DType dt : {DType::F32, DType::BF16}) {
      Problem pb(cs, dt, seed++);
      std::vector<Activation> acts = {Activation::None};
      if (cs.gated) acts = big ? std::vector<Activation>{Activation::SiluMul}
                               : std::vector<Activation>{Activation::SiluMul, Activation::GeluTanhMul,
                                                         Activation::GeluErfMul, Activation::None};
      for (Activation act : acts) {
        for (DType cdt : {DType::F32, DType::BF16}) {
          const size_t cn = static_cast<size_t>(std::max<int64_t>(pb.total + cs.row0, 1) * pb.ldc);
          const size_t es = dtype_size(cdt);
          std::vector<uint8_t> ref(cn * es, 0xA5);
          grouped_gemm_reference(pb.params(ref.data(), cdt, act));
          for (Isa isa : isas) {
            IsaScope scope(isa);
            std::vector<uint8_t> got(cn * es, 0xA5);
            grouped_gemm(pb.params(got.data(), cdt, act));
            const std::string what = describe(cs, dt, cdt, act, isa);
            int bad = 0;
            for (int64_t e = 0; e < static_cast<int64_t>(cs.rows.size()) && bad < 5; ++e) {
              for (int64_t r = pb.off[e]; r < pb.off[e + 1] && bad < 5; ++r) {
                for (int64_t col = 0; col < pb.ldc; ++col) {
                  const int64_t i = r * pb.ldc + col;
                  if (col >= pb.w.n_out()) {  // ldc padding must be untouched
                    if (std::memcmp(&got[i * es], &ref[i * es], es) != 0 && bad++ < 5)
                      ADD_FAILURE() << what << ": wrote padding r=" << r << " col=" << col;
                    continue;
                  }
                  const double g = read_elem(got.data(), cdt, i), f = read_elem(ref.data(), cdt, i);
                  double x, scale;
                  pb.exact(e, r, col, act, &x, &scale);
                  double tol = 1e-5 * scale + 1e-30;
                  if (cdt == DType::BF16) tol += bf16_ulp(f);
                  if (!(std::abs(g - f) <= tol) && bad++ < 5)
                    ADD_FAILURE() << what << ": r=" << r << " col=" << col << " kernel " << g << " ref " << f
                                  << " tol " << tol;
                }
              }
            }
            // Rows outside [offsets[0], offsets[E]) untouched.
            for (int64_t r = 0; r < cs.row0; ++r)
              for (int64_t col = 0; col < pb.ldc; ++col)
                ASSERT_EQ(got[(r * pb.ldc + col) * es], 0xA5) << what;
            ASSERT_EQ(bad, 0) << what;
          }
        }
      }
    }
  }
}

// The reference itself against an independent float64 computation from the unpacked weights.
TEST(GroupedGemm, ReferenceMatchesFloat64) {
  uint32_t seed = 500;
  for (const Case& cs : cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      Problem pb(cs, dt, seed++);
      for (Activation act : cs.gated ? std::vector<Activation>{Activation::SiluMul, Activation::GeluTanhMul,
                                                                Activation::GeluErfMul}
                                     : std::vector<Activation>{Activation::None}) {
        std::vector<float> ref(static_cast<size_t>(std::max<int64_t>(pb.total + cs.row0, 1) * pb.ldc));
        grouped_gemm_reference(pb.params(ref.data(), DType::F32, act));
        for (int64_t e = 0; e < static_cast<int64_t>(cs.rows.size()); ++e)
          for (int64_t r = pb.off[e]; r < pb.off[e + 1]; ++r)
            for (int64_t col = 0; col < pb.w.n_out(); ++col) {
              double x, scale;
              pb.exact(e, r, col, act, &x, &scale);
              const double got = ref[r * pb.ldc + col];
              // f32 summation error (K up to 2048, random signs) + the activation's ~1e-7 error.
              ASSERT_LE(std::abs(got - x), 2e-6 * scale + 1e-6 * std::abs(x) + 1e-30)
                  << describe(cs, dt, DType::F32, act, Isa::Portable) << " r=" << r << " col=" << col;
            }
      }
    }
  }
}

TEST(GroupedGemm, RejectsBadParams) {
  PackedExperts p = make_packed_experts(2, 8, 4, DType::F32, false);
  std::vector<float> a(16), c(16);
  int64_t off[3] = {0, 1, 2};
  GroupedGemmParams gp;
  gp.w = &p;
  gp.a = a.data();
  gp.lda = 4;
  gp.offsets = off;
  gp.c = c.data();
  gp.ldc = 8;
  gp.act = Activation::SiluMul;  // ungated weights
  EXPECT_THROW(grouped_gemm(gp), Error);
  gp.act = Activation::None;
  gp.lda = 3;
  EXPECT_THROW(grouped_gemm(gp), Error);
  gp.lda = 4;
  int64_t bad[3] = {0, 2, 1};
  gp.offsets = bad;
  EXPECT_THROW(grouped_gemm(gp), Error);
  gp.offsets = off;
  EXPECT_NO_THROW(grouped_gemm(gp));
}

}  // namespace
}  // namespace moe
