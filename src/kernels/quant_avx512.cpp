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
// q = clamp(rint(x' * f), +-127) (dynamic: f = 127 / amax) or clamp(rint(x' / f), +-127)
// (static: f = the scale), x' = x / smooth; zero pad to the scale, then the scale. The
// two forms are the scalar definitions' (quant.cpp), operation for operation.
template <bool kDivide>
void write_q8(const float* x, const float* smooth, int64_t k, float f, float scale, int8_t* q) {
  const __m512 vf = _mm512_set1_ps(f), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = tail_mask(k - i);
    const __m512 v = load_v(x, smooth, i, m);
    __m512 r = _mm512_roundscale_ps(kDivide ? _mm512_div_ps(v, vf) : _mm512_mul_ps(v, vf),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  for (int64_t i = k; i < q8_scale_offset(k); ++i) q[i] = 0;
  std::memcpy(q + q8_scale_offset(k), &scale, 4);
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
  write_q8</*kDivide=*/false>(x, smooth, k, inv, scale, q);
}

void quantize_row_q8_static_avx512(const float* x, const float* smooth, int64_t k, float s, void* dst) {
  write_q8</*kDivide=*/true>(x, smooth, k, s, s, static_cast<int8_t*>(dst));
}

}  // namespace moe::quant_detail
