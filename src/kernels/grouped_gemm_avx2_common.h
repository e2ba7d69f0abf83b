// Private to the *_avx2.cpp kernels (compiled with -mavx2 -mfma -mf16c): the epilogue's
// vector ops of the activation math, the f32 -> bf16 rounding and the shared epilogue
// over an f32 tile, used by the bf16/f32, int8 and fp8 grouped GEMMs on AVX2.
// Internal linkage, so no AVX2 copy of these can be merged into baseline code (see the
// ODR note in grouped_gemm_impl.h).
//
// AVX2 has no mask registers: a kernel writes its accumulators to a 64-column f32 tile
// (on the stack, in L1) and the epilogue here reads it back, applies the activation with
// ymm ops and stores only the valid columns. That costs 64 stores and loads per row and
// panel against K multiply-adds per column (K >= 128 in every real model).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

// Prefetch distance for the weight stream, as in the AVX-512 kernels: 16 k steps of a
// 256-byte panel row ahead, enough for DRAM latency at the per-core streaming rate.
constexpr int kAvx2PrefetchBytes = 4096;

// The activation math of ActMath on 8 f32 lanes, op for op the same IEEE operations as
// ScalarOps (explicit FMA where ScalarOps calls std::fma), so the vector epilogue and the
// scalar act_gate() agree bit for bit.
struct Avx2Ops {
  using V = __m256;
  static V c(float x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static V rint(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2n(V n) {  // n integral in [-126, 127]
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static V select_nonneg(V g, V a, V b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ)); }
};

// f32 bits -> bf16 in the high half of each 32-bit lane, exactly as moe::f32_to_bf16:
// NaN -> (u >> 16) | 0x40 (quiet), else u + 0x7fff + lsb (round to nearest even). Shared
// with the AVX2 panel packer (pack_avx2.cpp).
inline __m256i round_to_bf16_hi(__m256i u) {
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
}

// The same, left in the low 16 bits of each lane (ready for packus).
inline __m256i bf16_bits_avx2(__m256 v) { return _mm256_srli_epi32(round_to_bf16_hi(_mm256_castps_si256(v)), 16); }

// One row of a finished f32 tile (64 packed columns: gated = 32 gate then 32 up) ->
// act(gate) * up or the plain values, stored as c_dtype into the nv valid columns at col0.
inline void avx2_epilogue_row(const Job& j, const float* t, char* crow, int64_t col0, int nv) {
  alignas(32) float out[kPanel];
  if (j.gated) {
    for (int c = 0; c < kGateCols; c += 8) {
      const __m256 g = ActMath<Avx2Ops>::gate(j.act, _mm256_load_ps(t + c));
      _mm256_store_ps(out + c, _mm256_mul_ps(g, _mm256_load_ps(t + kGateCols + c)));
    }
  } else {
    std::memcpy(out, t, sizeof(out));
  }
  if (j.c_dtype == DType::F32) {
    std::memcpy(reinterpret_cast<float*>(crow) + col0, out, static_cast<size_t>(nv) * sizeof(float));
    return;
  }
  alignas(32) uint16_t o16[kPanel];
  for (int c = 0; c < nv; c += 16) {
    // packus interleaves the 128-bit lanes of its two sources; the permute restores order.
    const __m256i p = _mm256_packus_epi32(bf16_bits_avx2(_mm256_load_ps(out + c)), bf16_bits_avx2(_mm256_load_ps(out + c + 8)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o16 + c), _mm256_permute4x64_epi64(p, 0xd8));
  }
  std::memcpy(reinterpret_cast<uint16_t*>(crow) + col0, o16, static_cast<size_t>(nv) * sizeof(uint16_t));
}

// The int4 GEMM's i4_group_sums (grouped_gemm_int4_impl.h) in ymm, for the AVX2 and
// AVX512-VNNI runners: vpmaddubsw (ones x bytes: pairs in int16, no saturation at 2 x
// 127) and vpmaddwd (pairs of those in int32) over 32 bytes at a time. Integer sums, so
// the same values as the scalar loop. Whole groups inside K only; a group that reaches
// past K (the fixtures' odd K) takes the scalar loop.
inline void i4_group_sums_avx2(const int8_t* a, int64_t K, int64_t group, int64_t n_groups, int32_t* sa,
                               void (*scalar)(const int8_t*, int64_t, int64_t, int64_t, int32_t*)) {
  int64_t G = 0;
  if (group % 32 == 0) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const int64_t per = group / 32;
    for (; G < n_groups && (G + 1) * group <= K; ++G) {
      __m256i acc = _mm256_setzero_si256();
      for (int64_t h = 0; h < per; ++h) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + G * group + 32 * h));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x), ones16));
      }
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      sa[G] = _mm_cvtsi128_si32(s);
    }
  }
  if (G < n_groups) scalar(a + G * group, K - G * group, group, n_groups - G, sa + G);
}

}  // namespace
}  // namespace moe::gg
