// Private to the *_avx512.cpp kernels (compiled with AVX-512 flags): the epilogue's
// column masks and stores, shared by the bf16/f32 and the int8 grouped GEMMs.
// Internal linkage, so no AVX-512 copy of these can be merged into baseline code
// (see the ODR note in grouped_gemm_impl.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

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

}  // namespace
}  // namespace moe::gg
