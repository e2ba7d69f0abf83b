// W8A8 quantisation and the int8 grouped GEMM; FP8 E4M3 block dequantisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "kernels/grouped_gemm.h"
#include "kernels/permute.h"
#include "kernels/quant.h"
#include "test_util.h"

namespace moe {
namespace {

std::vector<Isa> isas() { return {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}; }

// Q8 rows of a [rows, k] f32 tensor (optionally divided by smooth [k]).
std::vector<char> q8_rows(const Tensor& x, const float* smooth = nullptr) {
  const int64_t rows = x.dim(0), k = x.dim(1);
  std::vector<char> out(rows * q8_row_bytes(k));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row_q8_reference(x.data<float>() + r * k, smooth, k, out.data() + r * q8_row_bytes(k));
  return out;
}

TEST(Quant, VectorRowQuantiserMatchesReferenceBitwise) {
  for (int64_t k : {1, 3, 4, 17, 64, 301, 2048}) {
    const Tensor x = test::random_f32({5, k}, 2.f, 10 + k);
    Tensor s = test::random_f32({k}, 1.f, 20 + k);
    for (int64_t i = 0; i < k; ++i) s.data<float>()[i] = 0.25f + std::fabs(s.data<float>()[i]);
    for (const float* sm : {static_cast<const float*>(nullptr), static_cast<const float*>(s.data<float>())})
      for (int64_t r = 0; r < 5; ++r) {
        std::vector<char> a(q8_row_bytes(k), 1), b(q8_row_bytes(k), 2);
        quantize_row_q8_reference(x.data<float>() + r * k, sm, k, a.data());
        quantize_row_q8(x.data<float>() + r * k, sm, k, b.data());
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << "k=" << k << " row " << r;
      }
  }
  // A zero row: scale 0, all q 0.
  std::vector<float> z(37, 0.f);
  std::vector<char> q(q8_row_bytes(37), 5);
  quantize_row_q8(z.data(), nullptr, 37, q.data());
  EXPECT_EQ(q8_row_scale(q.data(), 37), 0.f);
  for (int i = 0; i < 37; ++i) EXPECT_EQ(q[i], 0);
}

TEST(Quant, RoundingIsHalfToEvenAndSymmetric) {
  // amax 127 -> inv 1: q = nearbyint(v).
  const float x[6] = {127.f, 0.5f, 1.5f, 2.5f, -2.5f, -127.f};
  std::vector<char> q(q8_row_bytes(6));
  quantize_row_q8_reference(x, nullptr, 6, q.data());
  const int8_t want[6] = {127, 0, 2, 2, -2, -127};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<int8_t>(q[i]), want[i]) << i;
  EXPECT_EQ(q8_row_scale(q.data(), 6), 1.f);
}

// One expert of i8 weights, rows [rows, K] of activations; kernel vs reference.
struct I8Case {
  int64_t E, N, K;
  bool gated;
};

PackedExperts make_i8(const I8Case& c, uint64_t seed, bool smooth) {
  PackedExperts w = make_packed_experts(c.E, c.N, c.K, DType::I8, c.gated);
  for (int64_t e = 0; e < c.E; ++e) {
    if (smooth) {
      Tensor s = test::random_f32({c.K}, 1.f, seed + 100 + e);
      for (int64_t i = 0; i < c.K; ++i) s.data<float>()[i] = 0.5f + std::fabs(s.data<float>()[i]);
      set_expert_smooth(w, e, s);
    }
    pack_expert(w, e, test::random_f32({c.N, c.K}, 0.05f, seed + e));
  }
  return w;
}

TEST(GroupedGemmInt8, ExactInt32AccumulatorsEveryIsa) {
  for (const I8Case c : {I8Case{3, 70, 33, false}, I8Case{2, 128, 256, false}, I8Case{1, 5, 2050, false}}) {
    PackedExperts w = make_i8(c, 7, false);
    const std::vector<int64_t> offsets = c.E == 3 ? std::vector<int64_t>{0, 9, 9, 20}
                                                  : c.E == 2 ? std::vector<int64_t>{0, 1, 40} : std::vector<int64_t>{0, 3};
    const int64_t rows = offsets.back();
    const std::vector<char> a = q8_rows(test::random_f32({rows, c.K}, 1.f, 8));
    GroupedGemmParams p;
    p.w = &w;
    p.a = a.data();
    p.lda = q8_row_bytes(c.K);
    p.offsets = offsets.data();
    p.c_dtype = DType::I32;
    p.ldc = c.N;
    Tensor ref = Tensor::zeros({rows, c.N}, DType::I32);
    p.c = ref.raw();
    grouped_gemm_reference(p);
    for (Isa isa : isas()) {
      set_isa_cap(isa);
      Tensor got = Tensor::zeros({rows, c.N}, DType::I32);
      p.c = got.raw();
      grouped_gemm(p);
      ASSERT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes())) << isa_name(isa) << " N=" << c.N << " K=" << c.K;
    }
    set_isa_cap(kTopIsa);
  }
}

TEST(GroupedGemmInt8, DequantisedOutputsMatchReference) {
  for (bool smooth : {false, true})
    for (const I8Case c : {I8Case{2, 2 * 40, 301, true}, I8Case{4, 2 * 96, 256, true}, I8Case{2, 100, 130, false}})
      for (DType cd : {DType::F32, DType::BF16})
        for (int64_t per : {1, 3, 37}) {  // decode and prefill regimes; 37 x 4 = large M
          PackedExperts w = make_i8(c, 11, smooth);
          std::vector<int64_t> offsets(c.E + 1, 0);
          for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + per + e;
          const int64_t rows = offsets.back();
          const Tensor x = test::random_f32({rows, c.K}, 1.f, 12);
          std::vector<char> a(rows * q8_row_bytes(c.K));
          QuantizeRowsParams qp;
          qp.x = x.raw();
          qp.ldx = c.K;
          qp.rows = rows;
          qp.k = c.K;
          qp.offsets = offsets.data();
          qp.n_experts = c.E;
          qp.smooth = w.smooth.defined() ? w.smooth.data<float>() : nullptr;
          qp.dst = a.data();
          qp.ld_dst = q8_row_bytes(c.K);
          quantize_rows_q8(qp);
          const int64_t n_out = w.n_out();
          GroupedGemmParams p;
          p.w = &w;
          p.a = a.data();
          p.lda = q8_row_bytes(c.K);
          p.offsets = offsets.data();
          p.c_dtype = cd;
          p.ldc = n_out;
          p.act = c.gated ? Activation::SiluMul : Activation::None;
          Tensor ref = Tensor::zeros({rows, n_out}, cd);
          p.c = ref.raw();
          grouped_gemm_reference(p);
          const double rtol = per * c.E > 64 ? 2e-2 : 1e-2;
          for (Isa isa : isas()) {
            set_isa_cap(isa);
            Tensor got = Tensor::zeros({rows, n_out}, cd);
            p.c = got.raw();
            grouped_gemm(p);
            EXPECT_TRUE(test::all_close(got, ref, {1e-5, rtol})) << isa_name(isa);
            // In fact every ISA gives the reference's bits.
            EXPECT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes())) << isa_name(isa);
          }
          set_isa_cap(kTopIsa);
        }
}

TEST(GroupedGemmInt8, CloseToTheFloatGemm) {
  // Quantisation error only: the W8A8 result against the f32 GEMM of the same weights.
  const int64_t N = 2 * 64, K = 512, rows = 16;
  const Tensor wf = test::random_f32({N, K}, 0.05f, 31);
  PackedExperts wq = make_packed_experts(1, N, K, DType::I8, true);
  PackedExperts w32 = make_packed_experts(1, N, K, DType::F32, true);
  pack_expert(wq, 0, wf);
  pack_expert(w32, 0, wf);
  const Tensor x = test::random_f32({rows, K}, 1.f, 32);
  const std::vector<char> a = q8_rows(x);
  const int64_t off[2] = {0, rows};
  Tensor yq = Tensor::zeros({rows, N / 2}, DType::F32), yf = yq.clone();
  GroupedGemmParams p;
  p.w = &wq;
  p.a = a.data();
  p.lda = q8_row_bytes(K);
  p.offsets = off;
  p.c = yq.raw();
  p.ldc = N / 2;
  p.act = Activation::SiluMul;
  grouped_gemm(p);
  p.w = &w32;
  p.a = x.raw();
  p.lda = K;
  p.c = yf.raw();
  grouped_gemm(p);
  double dot = 0, nq = 0, nf = 0;
  for (int64_t i = 0; i < yq.numel(); ++i) {
    dot += double(yq.data<float>()[i]) * yf.data<float>()[i];
    nq += double(yq.data<float>()[i]) * yq.data<float>()[i];
    nf += double(yf.data<float>()[i]) * yf.data<float>()[i];
  }
  EXPECT_GT(dot / std::sqrt(nq * nf), 0.999);
}

TEST(GroupedGemmInt8, BatchInvariance) {
  for (Isa isa : isas()) {
    set_isa_cap(isa);
    const int64_t K = 301, N = 2 * 40, rows = 70;
    PackedExperts w = make_i8({1, N, K, true}, 3, true);
    const std::vector<char> a = q8_rows(test::random_f32({rows, K}, 1.f, 4), w.smooth.data<float>());
    Tensor full = Tensor::zeros({rows, N / 2}, DType::F32);
    GroupedGemmParams p;
    p.w = &w;
    p.a = a.data();
    p.lda = q8_row_bytes(K);
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
            << isa_name(isa) << " rows [" << r0 << ", " << r0 + batch << ")";
      }
    }
  }
  set_isa_cap(kTopIsa);
}

TEST(GroupedGemmInt8, PackQ8RoundTripAndErrors) {
  const int64_t N = 70, K = 33;
  PackedExperts w = make_packed_experts(2, N, K, DType::I8, false);
  Tensor q = Tensor::empty({N, K}, DType::I8);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<int8_t>()[i] = static_cast<int8_t>((i * 37) % 255 - 127);
  Tensor s = test::random_f32({N}, 1.f, 5);
  for (int64_t i = 0; i < N; ++i) s.data<float>()[i] = std::fabs(s.data<float>()[i]);
  pack_expert_q8(w, 1, q, s);
  Tensor q2, s2;
  unpack_expert_q8(w, 1, q2, s2);
  EXPECT_EQ(0, std::memcmp(q.raw(), q2.raw(), q.nbytes()));
  EXPECT_EQ(0, std::memcmp(s.raw(), s2.raw(), s.nbytes()));
  EXPECT_THROW(pack_expert_q8(w, 0, q, test::random_f32({N + 1}, 1.f, 1)), Error);
  EXPECT_THROW(pack_expert_q8(w, 0, q, test::random_f32({N, 2}, 1.f, 1)), Error);
  EXPECT_THROW(pack_expert_q8(w, 0, Tensor::zeros({N, K + 1}, DType::I8), s), Error);
  EXPECT_THROW(set_expert_smooth(w, 0, test::random_f32({K - 1}, 1.f, 1)), Error);
  EXPECT_THROW(set_expert_smooth(w, 0, Tensor::zeros({K}, DType::F32)), Error);  // smooth must be > 0
  PackedExperts wb = make_packed_experts(1, N, K, DType::BF16, false);
  EXPECT_THROW(set_expert_smooth(wb, 0, test::random_f32({K}, 1.f, 1)), Error);
}

TEST(Quant, ExpandQuantizeEqualsGatherThenQuantize) {
  const int64_t T = 9, k = 2, E = 4, H = 70;
  std::vector<int32_t> ids = {0, 1, 2, 3, 1, 2, 0, 3, 3, 1, 2, 0, 1, 3, 0, 2, 2, 1};
  RouteIndex idx;
  gen_idx(ids.data(), T, k, E, idx);
  const Tensor x = test::random_f32({T, H}, 1.f, 9).to(DType::BF16);
  Tensor sm = test::random_f32({E, H}, 1.f, 10);
  for (int64_t i = 0; i < sm.numel(); ++i) sm.data<float>()[i] = 0.5f + std::fabs(sm.data<float>()[i]);
  for (const int64_t b : {0, 1}) {
    const int64_t e_end = 4, rows = idx.rows_in(b, e_end);
    std::vector<char> got(rows * q8_row_bytes(H));
    ExpandParams ep;
    ep.x = x.raw();
    ep.x_dtype = DType::BF16;
    ep.hidden = H;
    ep.ldx = H;
    ep.index = &idx;
    ep.expert_begin = b;
    ep.expert_end = e_end;
    ep.out = got.data();
    expand_quantize_q8(ep, sm.data<float>() + b * H);
    const Tensor xf = x.to(DType::F32);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = idx.offsets[b] + r;
      int64_t e = 0;
      while (idx.offsets[e + 1] <= pos) ++e;
      std::vector<char> want(q8_row_bytes(H));
      quantize_row_q8_reference(xf.data<float>() + idx.gather_idx[pos] * H, sm.data<float>() + e * H, H, want.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data() + r * q8_row_bytes(H), want.size())) << "row " << r;
    }
  }
}

// FP8 E4M3 (e4m3fn) from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits;
// exponent 0 = subnormal m/8 * 2^-6; S.1111.111 = NaN; no infinities.
TEST(Fp8, E4M3TableFromTheFormatDefinition) {
  for (int b = 0; b < 256; ++b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(b));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    const float want = static_cast<float>(s ? -mag : mag);
    EXPECT_EQ(0, std::memcmp(&got, &want, 4)) << "bits 0x" << std::hex << b << ": " << got << " vs " << want;
  }
  // Spot values: 1.0, 448 (max), the smallest subnormal 2^-9, -0.
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::signbit(f8e4m3_to_f32(0x80)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
}

TEST(Fp8, BlockDequantisationBitExactAndErrors) {
  const int64_t n = 256, k = 384, bn = 128, bk = 128;
  Tensor w = Tensor::empty({n, k}, DType::F8E4M3);
  auto* wp = static_cast<uint8_t*>(w.raw());
  for (int64_t i = 0; i < w.numel(); ++i) {
    uint8_t b = static_cast<uint8_t>((i * 2654435761u) >> 13);
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN weights
    wp[i] = b;
  }
  Tensor s = test::random_f32({n / bn, k / bk}, 1e-2f, 3);
  for (DType out : {DType::F32, DType::BF16}) {
    const Tensor got = dequantize_fp8_blocks(w, s, bn, bk, out);
    ASSERT_EQ(got.shape(), (Shape{n, k}));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const float v = f8e4m3_to_f32(wp[i * k + j]) * s.data<float>()[(i / bn) * (k / bk) + j / bk];
        if (out == DType::F32) {
          ASSERT_EQ(0, std::memcmp(&v, got.data<float>() + i * k + j, 4)) << i << "," << j;
        } else {
          ASSERT_EQ(f32_to_bf16(v), got.data<uint16_t>()[i * k + j]) << i << "," << j;
        }
      }
  }
  // Block shape not dividing the weight; scale of the wrong shape; not fp8.
  EXPECT_THROW(dequantize_fp8_blocks(w, s, 100, 128), Error);
  EXPECT_THROW(dequantize_fp8_blocks(w, test::random_f32({2, 2}, 1.f, 1)), Error);
  EXPECT_THROW(dequantize_fp8_blocks(w, test::random_f32({3, 2}, 1.f, 1)), Error);
  EXPECT_THROW(dequantize_fp8_blocks(Tensor::zeros({n, k}, DType::F32), s), Error);
  try {
    dequantize_fp8_blocks(w, test::random_f32({2, 2}, 1.f, 1));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected [2, 3]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe
