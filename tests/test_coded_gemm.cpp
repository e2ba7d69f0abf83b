// Group-coded weights beyond W4A8's zero points (kernels/grouped_gemm_int4.h): 4-bit codes
// with f32 offsets (GGUF Q4_K / Q4_1) and 8-bit codes with zero points or offsets (GGUF
// Q5_K, Q6_K, Q8_0, Q5_0, Q5_1), under Q8 activations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_int4.h"
#include "kernels/quant.h"
#include "test_isa.h"
#include "test_util.h"

namespace moe {
namespace {

struct Case {
  int64_t E, N, K;
  bool gated;
  CodedFormat f;
};

// Random codes in [0, 2^bits), scales of both signs (GGUF's d may be negative), offsets
// or zero points, as a GGUF block decomposes (gguf_types.h).
CodedWeight random_weight(int64_t n, int64_t k, const CodedFormat& f, std::mt19937& rng) {
  const int64_t ng = int4_n_groups(k, f.group);
  CodedWeight w;
  if (f.sb_groups > 0) {  // K-quant factors: f16 D (M) per super-block, i8 sc (u8 mn) per group
    const bool factors = f.sb_groups > 1;  // 1: none stored
    const int64_t nsb = (ng + f.sb_groups - 1) / f.sb_groups;
    std::uniform_real_distribution<float> d(-0.002f, 0.004f);
    w.u = Tensor::empty({n, k}, DType::U8);
    for (int64_t i = 0; i < w.u.numel(); ++i) w.u.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % (1u << f.bits));
    w.sb_d = Tensor::empty({n, nsb}, DType::F16);
    for (int64_t i = 0; i < w.sb_d.numel(); ++i) w.sb_d.data<uint16_t>()[i] = f32_to_f16(d(rng));
    if (factors) {
      w.sc = Tensor::empty({n, ng}, DType::I8);
      for (int64_t i = 0; i < w.sc.numel(); ++i) w.sc.data<int8_t>()[i] = static_cast<int8_t>(int(rng() % 256) - 128);
    }
    if (f.offsets) {
      w.sb_m = Tensor::empty({n, nsb}, DType::F16);
      for (int64_t i = 0; i < w.sb_m.numel(); ++i) w.sb_m.data<uint16_t>()[i] = f32_to_f16(d(rng));
      if (factors) {
        w.mn = Tensor::empty({n, ng}, DType::U8);
        for (int64_t i = 0; i < w.mn.numel(); ++i) w.mn.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 64);
      }
    } else {
      w.zero = Tensor::empty({n, ng}, DType::U8);
      for (int64_t i = 0; i < w.zero.numel(); ++i)
        w.zero.data<uint8_t>()[i] = static_cast<uint8_t>(f.zero >= 0 ? f.zero : rng() % (1u << f.bits));
    }
    return w;
  }
  w.u = Tensor::empty({n, k}, DType::U8);
  w.scale = Tensor::empty({n, ng}, DType::F32);
  std::uniform_real_distribution<float> s(-0.01f, 0.02f), o(-0.3f, 0.3f);
  for (int64_t i = 0; i < w.u.numel(); ++i) w.u.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % (1u << f.bits));
  for (int64_t i = 0; i < w.scale.numel(); ++i) w.scale.data<float>()[i] = s(rng);
  if (f.offsets) {
    w.offset = Tensor::empty({n, ng}, DType::F32);
    for (int64_t i = 0; i < w.offset.numel(); ++i) w.offset.data<float>()[i] = o(rng);
  } else {
    w.zero = Tensor::empty({n, ng}, DType::U8);
    for (int64_t i = 0; i < w.zero.numel(); ++i)
      w.zero.data<uint8_t>()[i] = static_cast<uint8_t>(f.zero >= 0 ? f.zero : rng() % (1u << f.bits));
  }
  return w;
}

PackedExperts make(const Case& c, std::vector<CodedWeight>* kept, uint32_t seed) {
  PackedExperts p = make_packed_experts_coded(c.E, c.N, c.K, c.gated, c.f);
  std::mt19937 rng(seed);
  for (int64_t e = 0; e < c.E; ++e) {
    CodedWeight w = random_weight(c.N, c.K, c.f, rng);
    pack_expert_coded(p, e, w);
    if (kept) kept->push_back(w);
  }
  return p;
}

std::vector<char> q8_rows(const Tensor& x) {
  const int64_t rows = x.dim(0), k = x.dim(1);
  std::vector<char> out(rows * q8_row_bytes(k));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row_q8_reference(x.data<float>() + r * k, nullptr, k, out.data() + r * q8_row_bytes(k));
  return out;
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

// GGUF's shapes (groups of 16 for Q6_K, 32 for the rest) and odd ones: k not a multiple
// of the group or of 8, tail panels, gated, a wide matrix whose decode tasks span panels.
const Case kCases[] = {
    {2, 70, 256, false, {32, 4, true}},   {3, 2 * 40, 301, true, {64, 4, true}},
    {2, 2 * 64, 512, true, {32, 4, true}}, {2, 70, 256, false, {16, 8, false}},
    {3, 2 * 40, 301, true, {16, 8, true}}, {2, 2 * 96, 256, true, {32, 8, false}},
    {1, 100, 130, false, {128, 8, true}},  {1, 4096, 64, false, {32, 8, true}},
    {1, 33, 1000, false, {64, 8, false}},
    // Super-block scales: Q4_K / Q5_K (8 groups of 32, offsets), Q6_K (16 of 16, zero
    // points), and a k whose last super-block is short.
    {2, 70, 512, false, {32, 4, true, 8}},  {3, 2 * 40, 256, true, {32, 4, true, 8}},
    {2, 2 * 64, 768, true, {16, 8, false, 16}}, {1, 4096, 256, false, {32, 8, true, 8}},
    {2, 70, 300, false, {32, 4, true, 8}},
    // One group per super-block: f16 scales (and offsets) per group, unit factors.
    {2, 70, 256, false, {32, 4, false, 1}}, {3, 2 * 40, 301, true, {32, 8, true, 1}},
    // One zero point for every group (GGUF's symmetric types): Q4_0 (8), Q8_0 (128), Q6_K
    // (32), and f32 scales with an odd k, gated.
    {2, 70, 256, false, {32, 4, false, 1, 8}}, {2, 2 * 96, 256, true, {32, 8, false, 1, 128}},
    {2, 2 * 64, 768, true, {16, 8, false, 16, 32}}, {3, 2 * 40, 301, true, {32, 4, false, 0, 15}},
    // 8-bit codes with one zero point other than Q8_0's 128 (the AVX2 runner's signed sums
    // equal the zero-point form's integers only for 128).
    {3, 2 * 40, 301, true, {32, 8, false, 1, 100}},
    // 6-bit codes (Q5_*, Q6_K): Q6_K's super-blocks with its zero point, Q5_K's, Q5_1's f16
    // d and -m, and odd shapes with f32 scales and per-group zero points or offsets.
    {2, 2 * 64, 768, true, {16, 6, false, 16, 32}}, {2, 70, 512, false, {32, 6, true, 8}},
    {3, 2 * 40, 256, true, {32, 6, true, 1}},       {3, 2 * 40, 301, true, {32, 6, true}},
    {1, 33, 1000, false, {64, 6, false}},           {1, 4096, 64, false, {16, 6, false}},
};

std::string name(const Case& c) {
  return fmt::format("N={} K={} {}-bit g{} {} sb{}", c.N, c.K, c.f.bits, c.f.group,
                     c.f.offsets ? "offsets" : c.f.zero >= 0 ? fmt::format("zero {}", c.f.zero) : "zeros", c.f.sb_groups);
}

TEST(CodedGemm, EveryIsaGivesTheReferenceBits) {
  for (const Case& c : kCases)
    for (DType cd : {DType::F32, DType::BF16})
      for (int64_t per : {1, 3, 4, 5, 37}) {  // decode (<= 4 rows) and prefill, with row tails
        const PackedExperts w = make(c, nullptr, 21);
        std::vector<int64_t> offsets(c.E + 1, 0);
        for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + per + (e == 1 ? -per : e);  // expert 1 empty
        const int64_t rows = offsets.back();
        const std::vector<char> a = q8_rows(test::random_f32({rows, c.K}, 1.f, 22));
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
              << isa_name(isa) << " " << name(c) << " rows/expert " << per;
        }
      }
}

// Scales 1, integer offsets and a_scale 1 make every float step exact (integers below
// 2^24), so the output is sum_k q_a * u - sum_k q_a * offset (or q_a * (u - z)),
// checked against a plain loop over the codes as given, at the extremes (u = 255,
// |a| = 127, groups of 128) where a 16-bit partial sum would saturate.
TEST(CodedGemm, ExactGroupSums) {
  const int64_t N = 70, K = 264;
  for (const CodedFormat f : {CodedFormat{16, 8, false}, CodedFormat{128, 8, true}, CodedFormat{32, 8, true},
                              CodedFormat{32, 4, true}, CodedFormat{128, 4, true}, CodedFormat{16, 6, false},
                              CodedFormat{128, 6, true}})
    for (int extreme : {0, 1}) {
      const int64_t ng = int4_n_groups(K, f.group), top = (1 << f.bits) - 1;
      PackedExperts w = make_packed_experts_coded(1, N, K, false, f);
      std::mt19937 rng(static_cast<uint32_t>(f.group + f.bits + extreme));
      CodedWeight cw;
      cw.u = Tensor::empty({N, K}, DType::U8);
      cw.scale = Tensor::empty({N, ng}, DType::F32);
      for (int64_t i = 0; i < cw.u.numel(); ++i)
        cw.u.data<uint8_t>()[i] = static_cast<uint8_t>(extreme ? top * (rng() & 1) : rng() % (top + 1));
      for (int64_t i = 0; i < cw.scale.numel(); ++i) cw.scale.data<float>()[i] = 1.0f;
      if (f.offsets) {
        cw.offset = Tensor::empty({N, ng}, DType::F32);
        for (int64_t i = 0; i < cw.offset.numel(); ++i) cw.offset.data<float>()[i] = float(int(rng() % 41) - 20);
      } else {
        cw.zero = Tensor::empty({N, ng}, DType::U8);
        for (int64_t i = 0; i < cw.zero.numel(); ++i)
          cw.zero.data<uint8_t>()[i] = static_cast<uint8_t>(extreme ? top * (rng() & 1) : rng() % (top + 1));
      }
      pack_expert_coded(w, 0, cw);
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
                for (int64_t k = 0; k < K; ++k) {
                  const int64_t G = n * ng + k / f.group;
                  const int64_t u = cw.u.data<uint8_t>()[n * K + k];
                  want += f.offsets ? int64_t(q[k]) * u - int64_t(q[k]) * int64_t(cw.offset.data<float>()[G])
                                    : int64_t(q[k]) * (u - cw.zero.data<uint8_t>()[G]);
                }
                ASSERT_EQ(static_cast<double>(want), out.data<float>()[r * N + n])
                    << isa_name(isa) << " " << f.bits << "-bit g" << f.group << " row " << r << " col " << n;
              }
            }
          }
        }
    }
}

// The GEMM is the float GEMM of the given weights (u * s - offset, (u - z) * s, computed
// here from the codes as given, in double) and the int8 activations, up to f32 rounding.
TEST(CodedGemm, IsTheFloatGemmOfTheGivenWeights) {
  for (const Case& c : kCases) {
    if (c.gated) continue;  // the activation would hide the sums
    std::vector<CodedWeight> kept;
    const PackedExperts w = make(c, &kept, 5);
    for (int64_t e = 0; e < c.E; ++e)  // super-blocks: the effective D * sc, M * mn
      if (c.f.sb_groups > 0) kept[e] = unpack_expert_coded(w, e);
    const int64_t rows = 3, ng = int4_n_groups(c.K, c.f.group);
    std::vector<int64_t> offsets(c.E + 1, 0);
    for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + rows;
    const std::vector<char> a = q8_rows(test::random_f32({offsets.back(), c.K}, 1.f, 6));
    Tensor got = Tensor::zeros({offsets.back(), c.N}, DType::F32);
    GroupedGemmParams p = params(w, a, offsets, DType::F32);
    p.c = got.raw();
    grouped_gemm(p);
    for (int64_t e = 0; e < c.E; ++e)
      for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
        const char* row = a.data() + r * q8_row_bytes(c.K);
        const auto* q = reinterpret_cast<const int8_t*>(row);
        const double as = q8_row_scale(row, c.K);
        for (int64_t n = 0; n < c.N; ++n) {
          double want = 0, mag = 0;
          for (int64_t k = 0; k < c.K; ++k) {
            const int64_t G = n * ng + k / c.f.group;
            const double u = kept[e].u.data<uint8_t>()[n * c.K + k], s = kept[e].scale.data<float>()[G];
            const double wv = c.f.offsets ? u * s - kept[e].offset.data<float>()[G]
                                          : (u - kept[e].zero.data<uint8_t>()[G]) * s;
            want += q[k] * as * wv;
            mag += std::fabs(q[k] * as * wv) + std::fabs(q[k] * as * u * s);
          }
          ASSERT_NEAR(got.data<float>()[r * c.N + n], want, 1e-6 * mag + 1e-30) << name(c) << " row " << r << " n " << n;
        }
      }
  }
}

// x and y (two storages of the same weights) give the same bits on every ISA, at 1 and 5
// rows per expert (decode and prefill).
void expect_same_gemm(const PackedExperts& x, const PackedExperts& y, const Case& c, uint64_t seed) {
  for (int64_t per : {1, 5}) {
    std::vector<int64_t> offsets(c.E + 1, 0);
    for (int64_t e = 0; e < c.E; ++e) offsets[e + 1] = offsets[e] + per;
    const std::vector<char> a = q8_rows(test::random_f32({offsets.back(), c.K}, 1.f, seed));
    for (Isa isa : test::available_isas()) {
      test::IsaScope scope(isa);
      Tensor gx = Tensor::zeros({offsets.back(), x.n_out()}, DType::F32), gy = gx.clone();
      GroupedGemmParams p = params(x, a, offsets, DType::F32);
      p.c = gx.raw();
      grouped_gemm(p);
      p = params(y, a, offsets, DType::F32);
      p.c = gy.raw();
      grouped_gemm(p);
      ASSERT_EQ(0, std::memcmp(gx.raw(), gy.raw(), gx.nbytes())) << isa_name(isa) << " " << name(c);
    }
  }
}

// The super-block form is a storage of the plain form: packed with its effective scales
// and offsets (D * sc, M * mn) in f32 per group, the plain form gives the same bits on
// every ISA, and the super-block effective values are f16(D) * sc exactly.
TEST(CodedGemm, SuperBlocksEqualThePlainFormOfTheirProducts) {
  for (const Case& c : kCases) {
    if (c.f.sb_groups == 0) continue;
    const PackedExperts sb = make(c, nullptr, 31);
    CodedFormat plain = c.f;
    plain.sb_groups = 0;
    PackedExperts pl = make_packed_experts_coded(c.E, c.N, c.K, c.gated, plain);
    const int64_t ng = int4_n_groups(c.K, c.f.group);
    for (int64_t e = 0; e < c.E; ++e) {
      CodedWeight w = unpack_expert_coded(sb, e);
      for (int64_t i = 0; i < w.scale.numel(); ++i) {
        const int64_t row = i / ng, G = i % ng, B = G / c.f.sb_groups, nsb = w.sb_d.dim(1);
        const float d = f16_to_f32(w.sb_d.data<uint16_t>()[row * nsb + B]);
        ASSERT_EQ(w.scale.data<float>()[i], w.sc.defined() ? d * static_cast<float>(w.sc.data<int8_t>()[i]) : d)
            << name(c);
      }
      w.sb_d = w.sb_m = w.sc = w.mn = Tensor();
      pack_expert_coded(pl, e, w);
    }
    expect_same_gemm(sb, pl, c, 32);
    // Fewer bytes: per group an i8 (and a u8) instead of one or two f32.
    EXPECT_LT(int4_bytes_per_expert(sb), int4_bytes_per_expert(pl)) << name(c);
  }
}

// A uniform zero point is a storage of the per-group form whose zero points all equal
// it: the same bits on every ISA, one byte per group fewer; a group whose zero point
// differs cannot be packed into it.
TEST(CodedGemm, UniformZeroEqualsThePerGroupForm) {
  for (const Case& c : kCases) {
    if (c.f.zero < 0) continue;
    std::vector<CodedWeight> kept;
    const PackedExperts uz = make(c, &kept, 41);
    EXPECT_FALSE(uz.w_zero.defined());
    CodedFormat per = c.f;
    per.zero = -1;
    PackedExperts pg = make_packed_experts_coded(c.E, c.N, c.K, c.gated, per);
    for (int64_t e = 0; e < c.E; ++e) {
      pack_expert_coded(pg, e, kept[e]);
      const CodedWeight back = unpack_expert_coded(uz, e);
      ASSERT_EQ(0, std::memcmp(back.zero.raw(), kept[e].zero.raw(), kept[e].zero.nbytes())) << name(c);
    }
    expect_same_gemm(uz, pg, c, 42);
    EXPECT_EQ(int4_bytes_per_expert(pg) - int4_bytes_per_expert(uz), pg.w_zero.nbytes() / static_cast<size_t>(c.E))
        << name(c);
    CodedWeight odd = kept[0];
    odd.zero = odd.zero.clone();
    odd.zero.data<uint8_t>()[3] ^= 1;
    PackedExperts target = make_packed_experts_coded(1, c.N, c.K, c.gated, c.f);
    EXPECT_THROW(pack_expert_coded(target, 0, odd), Error) << name(c);
  }
  EXPECT_FALSE(valid_coded_format({32, 4, true, 0, 8})) << "offsets have no zero point";
  EXPECT_FALSE(valid_coded_format({32, 4, false, 0, 16})) << "a 4-bit zero point above 15";
}

TEST(CodedGemm, PackRoundTripAndExpertCopies) {
  for (const Case& c : kCases) {
    std::vector<CodedWeight> kept;
    PackedExperts w = make(c, &kept, 9);
    for (int64_t e = 0; e < c.E; ++e) {
      const CodedWeight back = unpack_expert_coded(w, e);
      const bool sb = c.f.sb_groups > 0;  // then scale / offset come back computed, checked below
      for (const auto& [x, y] : {std::pair{&back.u, &kept[e].u}, std::pair{sb ? &back.sb_d : &back.scale, sb ? &kept[e].sb_d : &kept[e].scale},
                                 std::pair{&back.zero, &kept[e].zero}, std::pair{sb ? &back.sb_m : &back.offset, sb ? &kept[e].sb_m : &kept[e].offset},
                                 std::pair{&back.sc, &kept[e].sc}, std::pair{&back.mn, &kept[e].mn}}) {
        ASSERT_EQ(x->defined(), y->defined()) << name(c);
        if (x->defined()) {
          ASSERT_EQ(0, std::memcmp(x->raw(), y->raw(), y->nbytes())) << name(c) << " expert " << e;
        }
      }
    }
    // An EPLB move copies every piece, offsets and super-block factors included.
    PackedExperts to = make_packed_experts_coded(1, c.N, c.K, c.gated, c.f);
    copy_expert(to, 0, w, c.E - 1);
    const CodedWeight moved = unpack_expert_coded(to, 0), was = unpack_expert_coded(w, c.E - 1);
    for (const auto& [x, y] : {std::pair{&moved.scale, &was.scale}, std::pair{&moved.zero, &was.zero},
                               std::pair{&moved.offset, &was.offset}}) {
      ASSERT_EQ(x->defined(), y->defined()) << name(c);
      if (x->defined()) {
        ASSERT_EQ(0, std::memcmp(x->raw(), y->raw(), y->nbytes())) << name(c);
      }
    }
    ASSERT_EQ(0, std::memcmp(moved.u.raw(), kept.back().u.raw(), kept.back().u.nbytes())) << name(c);
  }
}

// Rows [r0, r1) of every tensor of w, copied.
CodedWeight row_range(const CodedWeight& w, int64_t r0, int64_t r1) {
  CodedWeight v;
  for (auto [dst, src] : {std::pair{&v.u, &w.u}, {&v.scale, &w.scale}, {&v.zero, &w.zero}, {&v.offset, &w.offset},
                          {&v.sb_d, &w.sb_d}, {&v.sb_m, &w.sb_m}, {&v.sc, &w.sc}, {&v.mn, &w.mn}})
    if (src->defined()) *dst = src->slice_rows(r0, r1).clone();
  return v;
}

// A loader packs a large weight a few rows at a time (gguf_experts.cpp): every split of
// the rows, gated (gate and up rows in the same panel) or not, with a short last piece,
// gives the bytes of packing it whole: codes, scales, zero points, offsets and factors.
TEST(CodedGemm, PackingInRowPiecesGivesTheWholePacksBytes) {
  for (const Case& c : kCases) {
    std::vector<CodedWeight> kept;
    const PackedExperts whole = make(c, &kept, 13);
    PackedExperts pieces = make_packed_experts_coded(c.E, c.N, c.K, c.gated, c.f);
    for (int64_t e = 0; e < c.E; ++e)
      for (int64_t r0 = 0, step = 1 + e * 7; r0 < c.N; r0 += step, step = step * 3 % 37 + 1)
        pack_expert_coded(pieces, e, row_range(kept[e], r0, std::min(c.N, r0 + step)), r0);
    for (const auto& [x, y] : {std::pair{&pieces.data, &whole.data}, {&pieces.w_scale, &whole.w_scale},
                               {&pieces.w_zero, &whole.w_zero}, {&pieces.w_offset, &whole.w_offset},
                               {&pieces.w_sb_d, &whole.w_sb_d}, {&pieces.w_sb_m, &whole.w_sb_m},
                               {&pieces.w_sc, &whole.w_sc}, {&pieces.w_mn, &whole.w_mn}}) {
      ASSERT_EQ(x->defined(), y->defined()) << name(c);
      if (x->defined()) {
        ASSERT_EQ(0, std::memcmp(x->raw(), y->raw(), y->nbytes())) << name(c);
      }
    }
  }
  // Errors name the index in the whole expert, and rows outside it are refused.
  std::mt19937 rng(5);
  const CodedFormat f{32, 4, true};
  PackedExperts p = make_packed_experts_coded(1, 8, 64, false, f);
  CodedWeight w = random_weight(3, 64, f, rng);
  w.u.data<uint8_t>()[70] = 16;
  try {
    pack_expert_coded(p, 0, w, 4);
    FAIL() << "a code of 16 in 4 bits was packed";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("code 326 of expert 0 is 16"), std::string::npos) << err.what();
  }
  w.u.data<uint8_t>()[70] = 1;
  try {
    pack_expert_coded(p, 0, w, 6);
    FAIL() << "rows 6..8 of an 8-row expert were packed";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("rows [6, 9) of expert 0 are outside its 8 rows"), std::string::npos)
        << err.what();
  }
}

TEST(CodedGemm, BadInputsNameTheProblem) {
  auto expect_error = [](auto&& fn, const std::string& what) {
    try {
      fn();
      FAIL() << "no error; expected one naming " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([] { make_packed_experts_coded(1, 8, 64, false, {16, 4, false}); }, "groups of 32, 64 or 128");
  expect_error([] { make_packed_experts_coded(1, 8, 64, false, {24, 8, true}); }, "16, 32, 64 or 128");
  expect_error([] { make_packed_experts_coded(1, 8, 64, false, {32, 5, true}); }, "5-bit");
  expect_error([] { make_packed_experts_coded(1, 8, 64, false, {32, 6, false, 0, 64}); }, "zero");
  // 6-bit codes take three quarters of a byte each (and 8-bit ones a byte).
  EXPECT_EQ(make_packed_experts_coded(1, 64, 256, false, {16, 6, false}).expert_stride, 64 * 256 * 3 / 4);
  EXPECT_EQ(make_packed_experts_coded(1, 64, 256, false, {16, 8, false}).expert_stride, 64 * 256);
  std::mt19937 rng(1);
  PackedExperts p = make_packed_experts_coded(1, 8, 64, false, {32, 4, true});
  CodedWeight w = random_weight(8, 64, {32, 4, true}, rng);
  w.u.data<uint8_t>()[3] = 16;
  expect_error([&] { pack_expert_coded(p, 0, w); }, "code 3 of expert 0 is 16");
  w.u.data<uint8_t>()[3] = 1;
  w.offset.data<float>()[1] = NAN;
  expect_error([&] { pack_expert_coded(p, 0, w); }, "offset 1 of expert 0 is nan");
  w.offset = Tensor();
  expect_error([&] { pack_expert_coded(p, 0, w); }, "expected offsets");
  // Offset-form experts hold GGUF's codes; quantising floats into them is not offered.
  expect_error([&] { pack_expert(p, 0, test::random_f32({8, 64}, 1.f, 1)); }, "pack_expert_coded");
  PackedExperts g8 = make_packed_experts_coded(1, 8, 64, false, {16, 8, false});
  CodedWeight z = random_weight(8, 64, {16, 8, false}, rng);
  z.scale.data<float>()[0] = INFINITY;
  expect_error([&] { pack_expert_coded(g8, 0, z); }, "scale 0 of expert 0 is inf");
  // The last code of a nibble-packed expert (the word-at-a-time path), and zero points:
  // out of range, or not the one code uniform-zero experts hold.
  CodedWeight c4 = random_weight(8, 64, {32, 4, false}, rng);
  PackedExperts p4 = make_packed_experts_coded(1, 8, 64, false, {32, 4, false});
  c4.u.data<uint8_t>()[8 * 64 - 1] = 200;
  expect_error([&] { pack_expert_coded(p4, 0, c4); }, "code 511 of expert 0 is 200");
  c4.u.data<uint8_t>()[8 * 64 - 1] = 15;
  c4.zero.data<uint8_t>()[5] = 16;
  expect_error([&] { pack_expert_coded(p4, 0, c4); }, "zero point 5 of expert 0 is 16");
  CodedFormat uf{32, 4, false};
  uf.zero = 8;
  PackedExperts pu = make_packed_experts_coded(1, 8, 64, false, uf);
  CodedWeight cu = random_weight(8, 64, uf, rng);
  pack_expert_coded(pu, 0, cu);  // every zero point 8: accepted
  cu.zero.data<uint8_t>()[15] = 7;
  expect_error([&] { pack_expert_coded(pu, 0, cu); }, "zero point 15 of expert 0 is 7, these experts hold 8");
  // K-quant super-block scales and mins must be finite f16 values (exponent all ones: not).
  for (const bool mins : {false, true}) {
    const CodedFormat kf{16, 6, mins, 16};
    PackedExperts pk = make_packed_experts_coded(1, 8, 256, false, kf);
    CodedWeight ck = random_weight(8, 256, kf, rng);
    pack_expert_coded(pk, 0, ck);
    Tensor& t = mins ? ck.sb_m : ck.sb_d;
    t.data<uint16_t>()[6] = 0x7e00;  // f16 NaN
    expect_error([&] { pack_expert_coded(pk, 0, ck); },
                 std::string("super-block ") + (mins ? "min" : "scale") + " 6 of expert 0 is nan");
    t.data<uint16_t>()[6] = 0xfc00;  // f16 -inf
    expect_error([&] { pack_expert_coded(pk, 0, ck); },
                 std::string("super-block ") + (mins ? "min" : "scale") + " 6 of expert 0 is -inf");
  }
}

// `moe-ep bench --dtype q8_0,q5_0,q4_0` (GGUF-coded routed experts) runs each layer and
// checks it against the f32 layer before timing (cosine >= 0.98; measured 0.9998, 0.998,
// 0.993 at the qwen3-30b-a3b shape): a wrong code, scale or zero point in its quantiser
// fails that check and the command.
TEST(CodedGemm, BenchOfGgufCodedExpertsPassesItsCheck) {
  std::string out;
  const int rc = test::run_command(std::string(MOE_EP_BINARY) +
                                       " bench --shape custom --hidden 128 --inter 64 --experts 16 --topk 4 "
                                       "--tokens 1,9 --seconds 0.01 --threads 2 --dtype q8_0,q5_0,q4_0",
                                   &out);
  ASSERT_EQ(rc, 0) << out;
  for (const char* d : {"dtype q8_0", "dtype q5_0", "dtype q4_0"}) EXPECT_NE(out.find(d), std::string::npos) << out;
  size_t oks = 0;
  for (size_t at = out.find(" ok ("); at != std::string::npos; at = out.find(" ok (", at + 1)) ++oks;
  EXPECT_EQ(oks, 6u) << out;  // 2 token counts x 3 dtypes
}

}  // namespace
}  // namespace moe
