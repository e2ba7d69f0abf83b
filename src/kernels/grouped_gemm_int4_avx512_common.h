// Private to the group-coded runners compiled with AVX-512 flags (grouped_gemm_int4_avx512.cpp,
// grouped_gemm_int4_amx.cpp): the zmm epilogue of a row and the 6-bit code decode. Internal
// linkage, as grouped_gemm_avx512_common.h (see the ODR note in grouped_gemm_impl.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_int4_impl.h"

namespace moe::gg {
namespace {

// i4_epilogue_row in zmm: t = acc * a_scale, then act(gate) * up or t (ActMath<Avx512Ops>
// does the scalar ActMath's operations lane by lane), stored as c_dtype. acc: f32 [64],
// 64-byte aligned.
inline void i4_epilogue_row_avx512(const Job& j, const float* acc, float a_scale, char* crow, int64_t col0, int nv) {
  const __m512 vas = _mm512_set1_ps(a_scale);
  if (j.gated) {
    for (int h = 0; h < 2; ++h) {
      const __m512 g = ActMath<Avx512Ops>::gate(j.act, _mm512_mul_ps(_mm512_load_ps(acc + 16 * h), vas));
      const __m512 u = _mm512_mul_ps(_mm512_load_ps(acc + kGateCols + 16 * h), vas);
      store16(j, crow, col0 + 16 * h, _mm512_mul_ps(g, u), col_mask(nv, 16 * h));
    }
    return;
  }
  for (int q = 0; q < 4; ++q)
    store16(j, crow, col0 + 16 * q, _mm512_mul_ps(_mm512_load_ps(acc + 16 * q), vas), col_mask(nv, 16 * q));
}

// 6-bit codes (the 192-byte quads of grouped_gemm_int4_impl.h): chunk q (columns 16q..16q+15)
// of the quad at `quad` as 16 columns x 4 k bytes, the [column][4 k] order of the 8-bit
// layout. Rebuilt from the chunk's 32 nibble bytes (low nibbles: columns 0-7, high: 8-15)
// and its 16 top-bit bytes broadcast to the 4 lanes, lane s shifted right by 2s. Codes <= 63.
inline __m512i g6_chunk_avx512(const uint8_t* quad, int q) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i nb = _mm256_load_si256(reinterpret_cast<const __m256i*>(quad + 32 * q));
  const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(nb, m4)),
                                        _mm256_and_si256(_mm256_srli_epi16(nb, 4), m4), 1);
  const __m512i top = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(quad + 128 + 16 * q)));
  const __m512i shifts = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  return _mm512_or_si512(
      lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(top, shifts), _mm512_set1_epi8(0x03)), 4));
}

}  // namespace
}  // namespace moe::gg
