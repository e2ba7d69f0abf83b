// FP8 E4M3 weight-only experts dequantised inside the grouped GEMM: the packed values
// equal dequantize_fp8_blocks (bf16) bit for bit, every ISA's GEMM equals the bf16 GEMM
// on those dequantised weights bit for bit, the weights take one byte per value, and bad
// codes, scales and block shapes are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "test_isa.h"
#include "kernels/quant.h"

namespace moe {
namespace {

using test::IsaScope;
using test::available_isas;

// Random e4m3 codes over the whole finite range (every code but the two NaNs, so
// subnormals, +-0 and +-448 all occur).
Tensor random_codes(int64_t n, int64_t k, uint32_t seed) {
  Tensor w = Tensor::empty({n, k}, DType::F8E4M3);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(w.raw());
  for (int64_t i = 0; i < n * k; ++i) {
    uint8_t c;
    do c = static_cast<uint8_t>(rng()); while ((c & 0x7f) == 0x7f);
    p[i] = c;
  }
  return w;
}

// Block scales spread over several binades, one block zero (an all-zero block).
Tensor random_scales(int64_t sn, int64_t sk, uint32_t seed) {
  Tensor s = Tensor::empty({sn, sk}, DType::F32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-12.0f, -4.0f);
  for (int64_t i = 0; i < sn * sk; ++i) s.data<float>()[i] = std::exp2(d(rng)) * (i % 5 == 3 ? -1.0f : 1.0f);
  if (sn * sk > 2) s.data<float>()[1] = 0.0f;
  return s;
}

struct Shape8 {
  int64_t n, k, bn, bk;
  bool gated;
};
const Shape8 kShapes[] = {{48, 32, 8, 16, true}, {130, 48, 10, 16, false}, {256, 256, 128, 128, true},
                          {64, 64, 32, 2, false}, {200, 96, 4, 32, true}};

struct Expert8 {
  Tensor w, s;
};

std::vector<Expert8> make_experts(const Shape8& sh, int64_t E, uint32_t seed) {
  std::vector<Expert8> out;
  for (int64_t e = 0; e < E; ++e)
    out.push_back({random_codes(sh.n, sh.k, seed + 17 * e), random_scales(sh.n / sh.bn, sh.k / sh.bk, seed + 17 * e + 1)});
  return out;
}

PackedExperts pack_fp8(const Shape8& sh, const std::vector<Expert8>& ex) {
  PackedExperts p = make_packed_experts_fp8(static_cast<int64_t>(ex.size()), sh.n, sh.k, sh.gated, sh.bk);
  for (size_t e = 0; e < ex.size(); ++e) pack_expert_fp8(p, static_cast<int64_t>(e), ex[e].w, ex[e].s, sh.bn);
  return p;
}

PackedExperts pack_dequantised_bf16(const Shape8& sh, const std::vector<Expert8>& ex) {
  PackedExperts p = make_packed_experts(static_cast<int64_t>(ex.size()), sh.n, sh.k, DType::BF16, sh.gated);
  for (size_t e = 0; e < ex.size(); ++e)
    pack_expert(p, static_cast<int64_t>(e), dequantize_fp8_blocks(ex[e].w, ex[e].s, sh.bn, sh.bk, DType::BF16));
  return p;
}

TEST(GroupedGemmFp8, PackedValuesAreTheBf16Dequantisation) {
  for (const Shape8& sh : kShapes) {
    const auto ex = make_experts(sh, 2, 7);
    const PackedExperts p = pack_fp8(sh, ex);
    // One byte per weight (plus padding columns): half of the bf16 packing.
    const PackedExperts pb = make_packed_experts(2, sh.n, sh.k, DType::BF16, sh.gated);
    EXPECT_EQ(p.data.nbytes() * 2, pb.data.nbytes());
    for (int64_t e = 0; e < 2; ++e) {
      const Tensor want = dequantize_fp8_blocks(ex[e].w, ex[e].s, sh.bn, sh.bk, DType::BF16).to(DType::F32);
      const Tensor got = unpack_expert(p, e);
      ASSERT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << "n=" << sh.n << " k=" << sh.k << " e=" << e;
    }
  }
}

TEST(GroupedGemmFp8, EveryIsaEqualsBf16GemmOnDequantisedWeights) {
  const std::vector<int64_t> rows = {1, 0, 3, 20, 7, 4, 2, 5};  // decode (<= 4 rows) and prefill tasks
  for (const Shape8& sh : kShapes) {
    const int64_t E = static_cast<int64_t>(rows.size());
    const auto ex = make_experts(sh, E, 11);
    const PackedExperts p8 = pack_fp8(sh, ex), pb = pack_dequantised_bf16(sh, ex);
    std::vector<int64_t> off(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + rows[e];
    const int64_t R = off[E];
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    Tensor a = Tensor::empty({R, sh.k}, DType::F32);
    for (int64_t i = 0; i < R * sh.k; ++i) a.data<float>()[i] = d(rng);
    a = a.to(DType::BF16);
    const int64_t n_out = sh.gated ? sh.n / 2 : sh.n;
    for (Isa isa : available_isas()) {
      IsaScope scope(isa);
      for (Activation act : sh.gated ? std::vector<Activation>{Activation::SiluMul, Activation::GeluTanhMul}
                                     : std::vector<Activation>{Activation::None}) {
        for (DType cd : {DType::F32, DType::BF16}) {
          Tensor c8 = Tensor::zeros({R, n_out}, cd), cb = Tensor::zeros({R, n_out}, cd);
          GroupedGemmParams g;
          g.a = a.raw();
          g.lda = sh.k;
          g.offsets = off.data();
          g.ldc = n_out;
          g.c_dtype = cd;
          g.act = act;
          g.w = &p8;
          g.c = c8.raw();
          grouped_gemm(g);
          g.w = &pb;
          g.c = cb.raw();
          grouped_gemm(g);
          ASSERT_EQ(std::memcmp(c8.raw(), cb.raw(), cb.nbytes()), 0)
              << isa_name(isa) << " n=" << sh.n << " k=" << sh.k << " act=" << int(act) << " c=" << dtype_name(cd);
          // And the scalar reference over the unpacked fp8 weights agrees to f32 rounding.
          if (cd == DType::F32 && isa == available_isas().back()) {
            Tensor cr = Tensor::zeros({R, n_out}, cd);
            g.w = &p8;
            g.c = cr.raw();
            grouped_gemm_reference(g);
            for (int64_t i = 0; i < R * n_out; ++i)
              ASSERT_NEAR(c8.data<float>()[i], cr.data<float>()[i], 1e-4f * (1.0f + std::fabs(cr.data<float>()[i])))
                  << i;
          }
        }
      }
    }
  }
}

TEST(GroupedGemmFp8, BadCodesScalesAndBlocksAreErrors) {
  const Shape8 sh{48, 32, 8, 16, true};
  const auto ex = make_experts(sh, 1, 3);
  auto msg = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // Block width odd (a VNNI pair would straddle two scales) or not dividing k.
  EXPECT_NE(msg([&] { make_packed_experts_fp8(1, 48, 30, true, 15); }).find("even and divide"), std::string::npos);
  EXPECT_NE(msg([&] { make_packed_experts_fp8(1, 48, 32, true, 12); }).find("divide k"), std::string::npos);
  PackedExperts p = make_packed_experts_fp8(1, sh.n, sh.k, sh.gated, sh.bk);
  // Block height not dividing gate/up (24 rows each).
  EXPECT_NE(msg([&] { pack_expert_fp8(p, 0, ex[0].w, random_scales(2, 2, 1), 16); }).find("block height"),
            std::string::npos);
  // Scale shape.
  EXPECT_NE(msg([&] { pack_expert_fp8(p, 0, ex[0].w, random_scales(5, 2, 1), 8); }).find("weight_scale_inv has shape"),
            std::string::npos);
  // A NaN code.
  Tensor bad = ex[0].w.clone();
  static_cast<uint8_t*>(bad.raw())[5 * 32 + 9] = 0xff;
  EXPECT_NE(msg([&] { pack_expert_fp8(p, 0, bad, ex[0].s, 8); }).find("NaN code 0xff at [5, 9]"), std::string::npos);
  // Scales that are not finite or would push products out of bf16's normal range.
  for (float v : {INFINITY, NAN, 1e-38f, 1e35f}) {
    Tensor s = ex[0].s.clone();
    s.data<float>()[3] = v;
    EXPECT_NE(msg([&] { pack_expert_fp8(p, 0, ex[0].w, s, 8); }).find("block scale"), std::string::npos) << v;
  }
  // Float weights into fp8 packing and vice versa.
  EXPECT_FALSE(msg([&] { pack_expert(p, 0, Tensor::zeros({48, 32}, DType::F32)); }).empty());
  PackedExperts pb = make_packed_experts(1, 48, 32, DType::BF16, true);
  EXPECT_FALSE(msg([&] { pack_expert_fp8(pb, 0, ex[0].w, ex[0].s, 8); }).empty());
}

}  // namespace
}  // namespace moe
