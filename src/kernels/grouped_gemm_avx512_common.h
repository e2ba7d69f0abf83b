// Private to the *_avx512.cpp kernels (compiled with AVX-512 flags): the epilogue's
// vector ops of the activation math, prefetch distance, column masks and stores, shared by the bf16/f32 and the int8 grouped GEMMs.
// Internal linkage, so no AVX-512 copy of these can be merged into baseline code
// (see the ODR note in grouped_gemm_impl.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

// Prefetch distance for the weight stream: far enough to cover DRAM latency at the
// per-core streaming rate (~100 ns x ~25 GB/s ~ 2.5 KB), short enough to stay in L1.
// Measured on Zen4 (2 threads, T=1/16 decode): none, 1, 2, 4 and 8 KiB all within the
// run-to-run noise of a shared VM; kept for machines whose hardware prefetcher gives up at
// each 4 KiB page boundary.
constexpr int kPrefetchBytes = 4096;

// FP8: 32 e4m3 codes (16 columns x 2 k of a panel's k-pair row) -> 32 bf16, each
// bf16(value * scale) rounded to nearest even; s_lo / s_hi hold the 16 + 16 scales times
// 2^8. Sign-extending the byte and shifting it left by 7 leaves sign in bit 15 and
// exponent and mantissa in bits 13..7; clearing bit 14 (a copy of the sign) makes the f16
// of value * 2^-8 exactly, subnormals included (both formats' subnormals are the
// mantissa times their smallest exponent, 2^8 apart). vcvtph2ps widens it exactly, the
// multiply by 2^8 * scale rounds once like value * scale, vcvtne2ps2bf16 rounds like
// f32_to_bf16. Scales are limited at pack time so no product is subnormal (the convert
// flushes those).
inline __m512i f8x32_to_bf16(const char* in, __m512 s_lo, __m512 s_hi) {
  const __m512i x = _mm512_cvtepi8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(in)));
  const __m512i f16 = _mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi16(static_cast<short>(0xbfff)));
  const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(f16)), s_lo);
  const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(f16, 1)), s_hi);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// The 128 scales of k block kb of an FP8 panel (64 columns x 2 k), times 2^8.
inline void f8_block_scales(const float* panel_scales, int64_t kb, __m512 (&s)[8]) {
  for (int q = 0; q < 8; ++q)
    s[q] = _mm512_mul_ps(_mm512_loadu_ps(panel_scales + kb * 2 * kPanel + 16 * q), _mm512_set1_ps(256.0f));
}

struct Avx512Ops {
  using V = __m512;
  static V c(float x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V abs(V a) { return _mm512_abs_ps(a); }
  static V rint(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2n(V n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static V select_nonneg(V g, V a, V b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ), b, a);
  }
};

inline __mmask16 col_mask(int nv, int first) {
  const int m = nv - first;
  return m >= 16 ? __mmask16(0xffff) : m <= 0 ? __mmask16(0) : __mmask16((1u << m) - 1);
}

// RNE f32 -> bf16, bit-identical to moe::f32_to_bf16.
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

inline void store16(const Job& j, char* crow, int64_t col, __m512 v, __mmask16 m) {
  if (!m) return;
  if (j.c_dtype == DType::F32) {
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(crow) + col, m, v);
  } else {
    _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(crow) + col, m, to_bf16(v));
  }
}

// The bf16/f32 kernels' epilogue for MR rows x one panel's 4 zmm of f32 sums: the gated
// activation act(gate) * up (gate columns in zmm 0-1, up in 2-3), masked stores of the
// nv valid columns from col0.
template <int MR>
inline void f32_epilogue(const Job& j, __m512 (&acc)[MR][4], char* c0, int64_t col0, int nv) {
  for (int r = 0; r < MR; ++r) {
    char* crow = c0 + r * j.ldc_bytes;
    if (j.gated) {
      for (int h = 0; h < 2; ++h) {
        const __m512 g = ActMath<Avx512Ops>::gate(j.act, acc[r][h]);
        store16(j, crow, col0 + 16 * h, _mm512_mul_ps(g, acc[r][2 + h]), col_mask(nv, 16 * h));
      }
    } else {
      for (int q = 0; q < 4; ++q) store16(j, crow, col0 + 16 * q, acc[r][q], col_mask(nv, 16 * q));
    }
  }
}

}  // namespace
}  // namespace moe::gg
