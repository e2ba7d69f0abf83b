// FP8 E4M3 -> bf16 panel dequantisation with AVX-512 (compiled with the AVX-512 BF16
// flags; called only when the CPU has them). Layout and contract: grouped_gemm_fp8.cpp.
//
// e4m3 -> f16 is a bit move: sign-extend the byte to 16 bits and shift left by 7; the
// sign lands in bit 15, exponent and mantissa in bits 13..7, and bit 14 (a copy of the
// sign) is cleared. An f16 with e4m3's exponent field has bias 15 instead of 7, so it is
// the e4m3 value times 2^-8, exactly, subnormals included (both formats' subnormals are
// the mantissa times their smallest exponent, 2^-8 apart). vcvtph2ps widens to f32
// exactly; multiplying by 256 * scale (exact: a power of two) gives the same f32 product
// as value * scale, and vcvtne2ps2bf16 rounds to nearest even like f32_to_bf16. Per 32
// values: 1 widening load, 1 shift, 1 and, 2 vcvtph2ps, 2 multiplies, 1 convert, 1 store.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {

void dequant_pairs_f8_avx512bf16(const Job& j, int64_t e, int64_t P, int64_t p0, int64_t p1, uint16_t* dst) {
  const char* src = j.w + e * j.expert_stride + P * j.panel_stride;
  const float* sc = j.f8_scale + e * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel;
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0xbfff));
  const __m512 two8 = _mm512_set1_ps(256.0f);
  char* out = reinterpret_cast<char*>(dst);
  for (int64_t pp = p0; pp < p1;) {
    const int64_t kb = pp / j.f8_kb_pairs, end = (kb + 1) * j.f8_kb_pairs < p1 ? (kb + 1) * j.f8_kb_pairs : p1;
    __m512 s[8];  // the 128 scales of a k-pair row (64 columns x 2 k) of block kb, times 2^8
    for (int q = 0; q < 8; ++q) s[q] = _mm512_mul_ps(_mm512_loadu_ps(sc + kb * 2 * kPanel + 16 * q), two8);
    for (; pp < end; ++pp) {
      const char* in = src + pp * 2 * kPanel;  // 128 bytes: 64 columns x 2 k
      _mm_prefetch(in + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(in + kPrefetchBytes + 64, _MM_HINT_T0);
      for (int h = 0; h < 4; ++h) {
        const __m512i x = _mm512_cvtepi8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(in + 32 * h)));
        const __m512i f16 = _mm512_and_si512(_mm512_slli_epi16(x, 7), keep);
        const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(f16)), s[2 * h]);
        const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(f16, 1)), s[2 * h + 1]);
        _mm512_store_si512(out + pp * 4 * kPanel + 64 * h, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      }
    }
  }
}

}  // namespace moe::gg
