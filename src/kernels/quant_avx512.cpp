// AVX-512 row quantiser (quant.h): the same IEEE operations as
// quantize_row_q8_reference, 16 lanes at a time, so both give the same bits.
// GCC 12 reports its own _mm512_undefined_*() inside _mm512_reduce_max_ps as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/quant.h"

namespace moe::quant_detail {

namespace {
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
inline __m512 load_v(const float* x, const float* smooth, int64_t i, __mmask16 m) {
  const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
  if (!smooth) return v;
  // Masked-off lanes divide 0 by 1 (not 0 by 0): they must stay 0, not NaN.
  return _mm512_div_ps(v, _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), m, smooth + i));
}
}  // namespace

void quantize_row_q8_avx512(const float* x, const float* smooth, int64_t k, void* dst) {
  auto* q = static_cast<int8_t*>(dst);
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = tail_mask(k - i);
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(load_v(x, smooth, i, m)));
  }
  const float amax = _mm512_reduce_max_ps(vmax);
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const float scale = amax / 127.0f;
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = tail_mask(k - i);
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(load_v(x, smooth, i, m), vinv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  for (int64_t i = k; i < q8_scale_offset(k); ++i) q[i] = 0;
  std::memcpy(q + q8_scale_offset(k), &scale, 4);
}

void quantize_row_q8_static_avx512(const float* x, const float* smooth, int64_t k, float s, void* dst) {
  auto* q = static_cast<int8_t*>(dst);
  const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = tail_mask(k - i);
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(load_v(x, smooth, i, m), vs),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  for (int64_t i = k; i < q8_scale_offset(k); ++i) q[i] = 0;
  std::memcpy(q + q8_scale_offset(k), &s, 4);
}

}  // namespace moe::quant_detail
