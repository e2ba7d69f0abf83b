// W4A8: int4 group-quantised weights with Q8 activations (kernels/grouped_gemm_int4.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_int4.h"
#include "kernels/quant.h"
#include "moe/fused_moe.h"
#include "test_isa.h"
#include "test_quant_util.h"
#include "test_util.h"

namespace moe {
namespace {

// Q8 rows of a [rows, k] f32 tensor, by the reference quantiser.
std::vector<char> q8_rows(const Tensor& x) {
  const int64_t rows = x.dim(0), k = x.dim(1);
  std::vector<char> out(rows * q8_row_bytes(k));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row_q8_reference(x.data<float>() + r * k, nullptr, k, out.data() + r * q8_row_bytes(k));
  return out;
}

struct I4Case {
  int64_t E, N, K;
  bool gated;
  int64_t group;
  bool zero_points;
};

PackedExperts make_i4(const I4Case& c, uint64_t seed) {
  PackedExperts w = make_packed_experts_int4(c.E, c.N, c.K, c.gated, c.group, c.zero_points);
  for (int64_t e = 0; e < c.E; ++e) {
    Tensor f = test::random_f32({c.N, c.K}, 0.05f, seed + e);
    // An offset per row, so the asymmetric quantiser's zero points vary.
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t k = 0; k < c.K; ++k) f.data<float>()[n * c.K + k] += 0.02f * float((n % 5) - 2);
    pack_expert(w, e, f);
  }
  return w;
}

GroupedGemmParams params(const PackedExperts& w, const std::vector<char>& a, const std::vector<int64_t>& offsets,
                         DType cd) {
  GroupedGemmParams p;
  p.w = &w;
  p.a = a.data();
  p.lda = q8_row_bytes(w.k);
  p.offsets = offsets.data();
  p.c_dtype = cd;
  p.ldc = w.n_out();
  p.act = w.gated ? Activation::SiluMul : Activation::None;
  return p;
}

// Odd shapes: k = g, k not a multiple of 8 or of g (short last group), tail panels, gated
// with I not a multiple of 32, a wide matrix whose decode tasks span several panels.
const I4Case kCases[] = {
    {2, 70, 32, false, 32, true},      {3, 2 * 40, 301, true, 64, true},   {2, 2 * 96, 256, true, 128, false},
    {1, 100, 130, false, 128, true},   {2, 2 * 20, 37, true, 32, false},   {1, 4096, 64, false, 32, true},
    {2, 2 * 64, 512, true, 32, false}, {1, 33, 1000, false, 64, false},
};

TEST(GroupedGemmInt4, EveryIsaGivesTheReferenceBits) {
  for (const I4Case& c : kCases)
    for (DType cd : {DType::F32, DType::BF16})
      for (int64_t per : {1, 3, 4, 5, 37}) {  // decode (<= 4 rows) and prefill, with row tails
        const PackedExperts w = make_i4(c, 11);
        std::vector<int64_t> offsets(c.E + 1, 0);
        for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + per + (e == 1 ? -per : e);  // expert 1 empty
        const int64_t rows = offsets.back();
        const std::vector<char> a = q8_rows(test::random_f32({rows, c.K}, 1.f, 12));
        GroupedGemmParams p = params(w, a, offsets, cd);
        Tensor ref = Tensor::zeros({rows, w.n_out()}, cd);
        p.c = ref.raw();
        grouped_gemm_reference(p);
        for (Isa isa : test::available_isas()) {
          test::IsaScope scope(isa);
          Tensor got = Tensor::zeros({rows, w.n_out()}, cd);
          p.c = got.raw();
          grouped_gemm(p);
          ASSERT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes()))
              << isa_name(isa) << " N=" << c.N << " K=" << c.K << " g=" << c.group << " rows/expert " << per;
        }
      }
}

// With scales 1 and a_scale 1 every float step is exact (integers below 2^24), so the
// output is the exact integer sum_k q_a * (u - z): checked against a plain loop over the
// codes as given (not unpacked), at the extremes (|a| = 127, u and z in {0, 15}) where an
// int16 partial sum would overflow if the kernel accumulated too long.
TEST(GroupedGemmInt4, ExactGroupSums) {
  const int64_t N = 70, K = 264;
  for (int64_t g : {32, 64, 128})
    for (int extreme : {0, 1}) {
      const int64_t ng = int4_n_groups(K, g);
      PackedExperts w = make_packed_experts_int4(1, N, K, false, g);
      Tensor u = Tensor::empty({N, K}, DType::U8), z = Tensor::empty({N, ng}, DType::U8);
      Tensor s = Tensor::empty({N, ng}, DType::F32);
      std::mt19937 rng(static_cast<uint32_t>(g + extreme));
      for (int64_t i = 0; i < u.numel(); ++i) u.data<uint8_t>()[i] = extreme ? 15 * (rng() & 1) : rng() % 16;
      for (int64_t i = 0; i < z.numel(); ++i) z.data<uint8_t>()[i] = extreme ? 15 * (rng() & 1) : rng() % 16;
      for (int64_t i = 0; i < s.numel(); ++i) s.data<float>()[i] = 1.0f;
      pack_expert_q4(w, 0, u, z, s);
      const int64_t rows = 6;
      std::vector<char> a(rows * q8_row_bytes(K), 0);
      for (int64_t r = 0; r < rows; ++r) {
        auto* q = reinterpret_cast<int8_t*>(a.data() + r * q8_row_bytes(K));
        for (int64_t k = 0; k < K; ++k)
          q[k] = static_cast<int8_t>(extreme ? (r % 2 ? -127 : 127) * ((rng() & 3) ? 1 : -1) : int(rng() % 255) - 127);
        const float one = 1.0f;
        std::memcpy(a.data() + r * q8_row_bytes(K) + q8_scale_offset(K), &one, 4);
      }
      for (Isa isa : test::available_isas())
        for (int64_t split : {1, 2, 6}) {  // 1 or 2 rows per call (decode), 6 (prefill)
          test::IsaScope scope(isa);
          for (int64_t r0 = 0; r0 < rows; r0 += split) {
            const std::vector<int64_t> off = {r0, r0 + split};
            Tensor out = Tensor::zeros({rows, N}, DType::F32);
            GroupedGemmParams p = params(w, a, off, DType::F32);
            p.c = out.raw();
            grouped_gemm(p);
            for (int64_t r = r0; r < r0 + split; ++r) {
              const auto* q = reinterpret_cast<const int8_t*>(a.data() + r * q8_row_bytes(K));
              for (int64_t n = 0; n < N; ++n) {
                int64_t want = 0;
                for (int64_t k = 0; k < K; ++k)
                  want += int64_t(q[k]) * (int64_t(u.data<uint8_t>()[n * K + k]) - z.data<uint8_t>()[n * ng + k / g]);
                ASSERT_EQ(static_cast<double>(want), out.data<float>()[r * N + n])
                    << isa_name(isa) << " g=" << g << " row " << r << " col " << n;
              }
            }
          }
        }
    }
}

double cosine(const Tensor& x, const Tensor& y) {
  double d = 0, nx = 0, ny = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    d += double(x.data<float>()[i]) * y.data<float>()[i];
    nx += double(x.data<float>()[i]) * x.data<float>()[i];
    ny += double(y.data<float>()[i]) * y.data<float>()[i];
  }
  return d / std::sqrt(nx * ny);
}

// The int4 GEMM is the float GEMM of the dequantised weights and activations up to float
// rounding; against the original float weights only the quantisation error remains.
TEST(GroupedGemmInt4, CloseToTheFloatGemm) {
  const int64_t N = 2 * 64, K = 512, rows = 16;
  const Tensor wf = test::random_f32({N, K}, 0.05f, 31);
  const Tensor x = test::random_f32({rows, K}, 1.f, 32);
  const std::vector<char> a = q8_rows(x);
  Tensor xq = Tensor::empty({rows, K}, DType::F32);  // the dequantised Q8 rows
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = a.data() + r * q8_row_bytes(K);
    for (int64_t k = 0; k < K; ++k) xq.data<float>()[r * K + k] = float(int8_t(row[k])) * q8_row_scale(row, K);
  }
  const std::vector<int64_t> off = {0, rows};
  auto f32_gemm = [&](const Tensor& w, const Tensor& in) {
    PackedExperts w32 = make_packed_experts(1, N, K, DType::F32, true);
    pack_expert(w32, 0, w);
    Tensor y = Tensor::zeros({rows, N / 2}, DType::F32);
    GroupedGemmParams p;
    p.w = &w32;
    p.a = in.raw();
    p.lda = K;
    p.offsets = off.data();
    p.c = y.raw();
    p.ldc = N / 2;
    p.act = Activation::SiluMul;
    grouped_gemm(p);
    return y;
  };
  const Tensor y_f32 = f32_gemm(wf, x);
  for (bool zp : {true, false})
    for (int64_t g : {32, 64, 128}) {
      PackedExperts wq = make_packed_experts_int4(1, N, K, true, g, zp);
      pack_expert(wq, 0, wf);
      Tensor yq = Tensor::zeros({rows, N / 2}, DType::F32);
      GroupedGemmParams p = params(wq, a, off, DType::F32);
      p.c = yq.raw();
      grouped_gemm(p);
      EXPECT_TRUE(test::all_close(yq, f32_gemm(unpack_expert(wq, 0), xq), {1e-5, 1e-4})) << "g=" << g;
      // 4-bit round to nearest: an error up to half a step (1/15 of the group's range) per
      // weight; measured 0.9930 / 0.9912 / 0.9904 (g = 32 / 64 / 128) with zero points and
      // 0.9884 / 0.9861 / 0.9837 symmetric; 0.98 leaves a margin below the worst.
      const double cos = cosine(yq, y_f32);
      EXPECT_GT(cos, 0.98) << "g=" << g << " zero points " << zp;
      std::printf("[ int4 ] g=%3ld %s: cosine vs f32 %.5f\n", long(g), zp ? "asym" : "sym ", cos);
    }
}

// A whole MoE layer (router, top-2 of 8 experts, combine) in W4A8 against the same layer
// in f32, for each group size; and W8A8 for scale. Weights Gaussian, or heavy-tailed
// (Gaussian times e^{N(0, 0.6)}: a few weights per group much larger than the rest, as in
// trained checkpoints), where smaller groups matter. The numbers go to docs/PERF_QUANT.md.
TEST(Int4Layer, CosineVsF32ByGroup) {
  const int64_t H = 1024, I = 384, E = 8, T = 32;
  const MoeConfig cfg = test::w8a8_config(H, I, E, 2);
  const Tensor x = test::random_f32({T, H}, 1.f, 77);
  for (bool heavy : {false, true}) {
    std::vector<Tensor> w13(E), w2(E);
    for (int64_t e = 0; e < E; ++e) {
      w13[e] = test::random_f32({2 * I, H}, 1.f / std::sqrt(float(H)), 100 + 2 * e);
      w2[e] = test::random_f32({H, I}, 1.f / std::sqrt(float(I)), 101 + 2 * e);
      if (heavy)
        for (Tensor* t : {&w13[e], &w2[e]}) {
          const Tensor m = test::random_f32(t->shape(), 0.6f, 900 + e + 50 * (t == &w2[e]));
          for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] *= std::exp(m.data<float>()[i]);
        }
    }
    auto layer = [&](int64_t group, DType dt) {
      MoeLayerWeights w;
      w.expert_begin = 0;
      w.expert_end = E;
      w.gate = make_packed_experts(1, E, H, DType::F32, false);
      pack_expert(w.gate, 0, test::random_f32({E, H}, 2.f / std::sqrt(float(H)), 1));
      w.w13 = group > 0 ? make_packed_experts_int4(E, 2 * I, H, true, group) : make_packed_experts(E, 2 * I, H, dt, true);
      w.w2 = group > 0 ? make_packed_experts_int4(E, H, I, false, group) : make_packed_experts(E, H, I, dt, false);
      for (int64_t e = 0; e < E; ++e) {
        pack_expert(w.w13, e, w13[e]);
        pack_expert(w.w2, e, w2[e]);
      }
      MoeLayer l(cfg, std::move(w));
      return l.forward(x);
    };
    const Tensor ref = layer(0, DType::F32);
    const double c8 = test::cosine(layer(0, DType::I8), ref);
    std::printf("[ int4 layer ] H=%ld I=%ld E=%ld top-2, %ld tokens, %s weights: w8a8 %.5f", long(H), long(I), long(E),
                long(T), heavy ? "heavy-tailed" : "Gaussian", c8);
    // Measured: Gaussian 0.9903 / 0.9874 / 0.9851, heavy-tailed 0.9837 / 0.9769 / 0.9666
    // (g = 32 / 64 / 128): the bounds leave a margin; smaller groups are more accurate.
    double prev = 1.0;
    for (int64_t g : {32, 64, 128}) {
      const double c = test::cosine(layer(g, DType::I8), ref);
      std::printf(", w4a8 g=%ld %.5f", long(g), c);
      EXPECT_GT(c, heavy ? 0.955 : 0.98) << "g=" << g << (heavy ? " heavy-tailed" : " Gaussian");
      EXPECT_LT(c, std::min(prev, c8)) << "g=" << g << ": not less accurate than a smaller group and int8";
      prev = c;
    }
    std::printf("\n");
  }
}

TEST(GroupedGemmInt4, BatchInvariance) {
  const int64_t K = 301, N = 2 * 40, rows = 70;
  const PackedExperts w = make_i4({1, N, K, true, 32, true}, 3);
  const std::vector<char> a = q8_rows(test::random_f32({rows, K}, 1.f, 4));
  for (Isa isa : test::available_isas()) {
    test::IsaScope scope(isa);
    Tensor full = Tensor::zeros({rows, N / 2}, DType::F32);
    const std::vector<int64_t> all = {0, rows};
    GroupedGemmParams p = params(w, a, all, DType::F32);
    p.c = full.raw();
    grouped_gemm(p);
    for (int64_t batch : {1, 2, 3, 5, 7, 13})
      for (int64_t r0 = 0; r0 + batch <= rows; r0 += 11) {
        Tensor part = Tensor::zeros({rows, N / 2}, DType::F32);
        const std::vector<int64_t> some = {r0, r0 + batch};
        p.offsets = some.data();
        p.c = part.raw();
        grouped_gemm(p);
        ASSERT_EQ(0, std::memcmp(part.data<float>() + r0 * (N / 2), full.data<float>() + r0 * (N / 2),
                                 batch * (N / 2) * 4))
            << isa_name(isa) << " rows [" << r0 << ", " << r0 + batch << ")";
      }
  }
}

// Prefill tasks of int4 weights take 4 panels, fewer when the team is large for the
// GEMM's panels (o_proj: 32 panels); the extent changes no bit: every team size gives the
// reference's.
TEST(GroupedGemmInt4, PrefillTasksNarrowOnALargeTeamWithTheSameBits) {
  const PackedExperts w = make_i4({1, 2048, 256, false, 32, true}, 21);  // 32 panels
  const int64_t rows = 37;
  const std::vector<int64_t> offsets = {0, rows};
  const std::vector<char> a = q8_rows(test::random_f32({rows, w.k}, 1.f, 22));
  GroupedGemmParams p = params(w, a, offsets, DType::F32);
  Tensor ref = Tensor::zeros({rows, w.n_out()}, DType::F32);
  p.c = ref.raw();
  grouped_gemm_reference(p);
  EXPECT_EQ(grouped_gemm_task_count(p, 2), 8);    // 4 panels a task
  EXPECT_EQ(grouped_gemm_task_count(p, 8), 16);   // 2
  EXPECT_EQ(grouped_gemm_task_count(p, 16), 32);  // 1
  for (Isa isa : test::available_isas()) {
    test::IsaScope scope(isa);
    for (int threads : {2, 8, 16}) {
      Tensor got = Tensor::zeros({rows, w.n_out()}, DType::F32);
      p.c = got.raw();
      {
        test::TeamScope team(threads);
        grouped_gemm(p);
      }
      ASSERT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes())) << isa_name(isa) << " threads " << threads;
    }
  }
}

TEST(GroupedGemmInt4, PackRoundTripAndQuantiser) {
  const int64_t N = 2 * 45, K = 100, g = 32, ng = int4_n_groups(K, g);
  ASSERT_EQ(ng, 4);
  PackedExperts w = make_packed_experts_int4(2, N, K, true, g);
  Tensor u = Tensor::empty({N, K}, DType::U8), z = Tensor::empty({N, ng}, DType::U8);
  for (int64_t i = 0; i < u.numel(); ++i) u.data<uint8_t>()[i] = static_cast<uint8_t>((i * 7 + i / 13) % 16);
  for (int64_t i = 0; i < z.numel(); ++i) z.data<uint8_t>()[i] = static_cast<uint8_t>((i * 5) % 16);
  Tensor s = test::random_f32({N, ng}, 1.f, 5);
  for (int64_t i = 0; i < s.numel(); ++i) s.data<float>()[i] = std::fabs(s.data<float>()[i]);
  pack_expert_q4(w, 1, u, z, s);
  Tensor u2, z2, s2;
  unpack_expert_q4(w, 1, u2, z2, s2);
  EXPECT_EQ(0, std::memcmp(u.raw(), u2.raw(), u.nbytes()));
  EXPECT_EQ(0, std::memcmp(z.raw(), z2.raw(), z.nbytes()));
  EXPECT_EQ(0, std::memcmp(s.raw(), s2.raw(), s.nbytes()));
  // Expert 0 was never packed: it reads as zeros.
  EXPECT_EQ(unpack_expert(w, 0).to(DType::F32).data<float>()[0], 0.f);

  // From float: each weight within half a step of its group's grid (and the grid holds 0
  // exactly with zero points; symmetric codes stay in [-7, 7] around z = 8).
  const Tensor f = test::random_f32({N, K}, 0.1f, 6);
  for (bool zp : {true, false}) {
    PackedExperts q = make_packed_experts_int4(1, N, K, true, g, zp);
    pack_expert(q, 0, f);
    const Tensor d = unpack_expert(q, 0);
    Tensor uq, zq, sq;
    unpack_expert_q4(q, 0, uq, zq, sq);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float step = sq.data<float>()[n * ng + k / g];
        ASSERT_LE(std::fabs(d.data<float>()[n * K + k] - f.data<float>()[n * K + k]), 0.5001f * step) << n << "," << k;
        if (!zp) {
          EXPECT_EQ(zq.data<uint8_t>()[n * ng + k / g], 8);
          EXPECT_GE(uq.data<uint8_t>()[n * K + k], 1);
        }
      }
  }
  // A zero group dequantises to exact zeros.
  PackedExperts q0 = make_packed_experts_int4(1, 4, 64, false, 32);
  pack_expert(q0, 0, Tensor::zeros({4, 64}, DType::F32));
  const Tensor d0 = unpack_expert(q0, 0);
  for (int64_t i = 0; i < d0.numel(); ++i) ASSERT_EQ(d0.data<float>()[i], 0.f);
}

TEST(GroupedGemmInt4, BadInputs) {
  EXPECT_THROW(make_packed_experts_int4(1, 64, 64, false, 16), Error);
  EXPECT_THROW(make_packed_experts_int4(1, 64, 64, false, 48), Error);
  EXPECT_THROW(make_packed_experts_int4(1, 63, 64, true, 32), Error);  // gated needs an even n
  const int64_t N = 8, K = 64;
  PackedExperts w = make_packed_experts_int4(1, N, K, false, 32);
  const Tensor u = Tensor::zeros({N, K}, DType::U8), z = Tensor::zeros({N, 2}, DType::U8);
  const Tensor s = Tensor::zeros({N, 2}, DType::F32);
  EXPECT_NO_THROW(pack_expert_q4(w, 0, u, z, s));
  EXPECT_THROW(pack_expert_q4(w, 1, u, z, s), Error);                                   // expert out of range
  EXPECT_THROW(pack_expert_q4(w, 0, Tensor::zeros({N, K + 1}, DType::U8), z, s), Error);  // codes shape
  EXPECT_THROW(pack_expert_q4(w, 0, Tensor::zeros({N, K}, DType::I8), z, s), Error);      // codes dtype
  EXPECT_THROW(pack_expert_q4(w, 0, u, Tensor::zeros({N, 3}, DType::U8), s), Error);      // one zero per group
  EXPECT_THROW(pack_expert_q4(w, 0, u, z, Tensor::zeros({N, 1}, DType::F32)), Error);     // one scale per group
  Tensor big = u.clone();
  big.data<uint8_t>()[5] = 16;
  EXPECT_THROW(pack_expert_q4(w, 0, big, z, s), Error);
  Tensor zbig = z.clone();
  zbig.data<uint8_t>()[1] = 200;
  EXPECT_THROW(pack_expert_q4(w, 0, u, zbig, s), Error);
  Tensor sneg = s.clone();
  sneg.data<float>()[3] = -1.f;
  EXPECT_THROW(pack_expert_q4(w, 0, u, z, sneg), Error);
  sneg.data<float>()[3] = NAN;
  EXPECT_THROW(pack_expert_q4(w, 0, u, z, sneg), Error);
  // The int8-only entry points refuse int4 experts; raw int32 output has no meaning here.
  Tensor q, sc;
  EXPECT_THROW(unpack_expert_q8(w, 0, q, sc), Error);
  EXPECT_THROW(pack_expert_q8(w, 0, Tensor::zeros({N, K}, DType::I8), Tensor::zeros({N}, DType::F32)), Error);
  PackedExperts wb = make_packed_experts(1, N, K, DType::BF16, false);
  EXPECT_THROW(unpack_expert_q4(wb, 0, q, sc, sc), Error);
  std::vector<char> a(q8_row_bytes(K), 0);
  const std::vector<int64_t> off = {0, 1};
  Tensor out = Tensor::zeros({1, N}, DType::I32);
  GroupedGemmParams p = params(w, a, off, DType::I32);
  p.c = out.raw();
  EXPECT_THROW(grouped_gemm(p), Error);
}

}  // namespace
}  // namespace moe
