// AVX2 row quantiser (quant.h): the same IEEE operations as quantize_row_q8_reference,
// 8 lanes at a time, so both give the same bits. Without it the scalar definition runs,
// whose nearbyint() is a libm call on baseline x86-64 (no SSE4.1 roundss): ~10 ns per
// value, which made W8A8 prefill spend more time quantising activations than multiplying.
#include <immintrin.h>

#include <cstring>

#include "kernels/quant.h"

namespace moe::quant_detail {

namespace {

// Lanes [0, n) of 8 set (n >= 8: all), as the all-ones int masks vmaskmovps reads.
inline __m256i lane_mask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 8 ? n : 8)), idx);
}
inline __m256 load_v(const float* x, const float* smooth, int64_t i, __m256i m) {
  const __m256 v = _mm256_maskload_ps(x + i, m);
  if (!smooth) return v;
  // Masked-off lanes divide 0 by 1 (not 0 by 0): they must stay 0, not NaN.
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(v, _mm256_blendv_ps(one, _mm256_maskload_ps(smooth + i, m), _mm256_castsi256_ps(m)));
}
// q = clamp(rint(x' * f), +-127) (dynamic: f = 127 / amax) or clamp(rint(x' / f), +-127)
// (static: f = the scale), x' = x / smooth; zero pad to the scale, then the scale.
template <bool kDivide>
void write_q8(const float* x, const float* smooth, int64_t k, float f, float scale, int8_t* q) {
  const __m256 vf = _mm256_set1_ps(f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (int64_t i = 0; i < k; i += 8) {
    const __m256i m = lane_mask(k - i);
    const __m256 v = load_v(x, smooth, i, m);
    __m256 r = _mm256_round_ps(kDivide ? _mm256_div_ps(v, vf) : _mm256_mul_ps(v, vf),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);  // NaN -> -127, as the scalar clamp
    const __m256i i32 = _mm256_cvtps_epi32(r);
    // |values| <= 127: the saturating packs only narrow; bytes 0..7 are lanes 0..7.
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
    const __m128i b8 = _mm_packs_epi16(w16, w16);
    if (k - i >= 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), b8);
    } else {
      alignas(16) int8_t t[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(t), b8);
      std::memcpy(q + i, t, static_cast<size_t>(k - i));
    }
  }
  for (int64_t i = k; i < q8_scale_offset(k); ++i) q[i] = 0;
  std::memcpy(q + q8_scale_offset(k), &scale, 4);
}

}  // namespace

void quantize_row_q8_avx2(const float* x, const float* smooth, int64_t k, void* dst) {
  auto* q = static_cast<int8_t*>(dst);
  __m256 vmax = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < k; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, load_v(x, smooth, i, lane_mask(k - i))));
  // max is exact in any order: reduce the 8 lanes.
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const float scale = amax / 127.0f;
  write_q8</*kDivide=*/false>(x, smooth, k, inv, scale, q);
}

void quantize_row_q8_static_avx2(const float* x, const float* smooth, int64_t k, float s, void* dst) {
  write_q8</*kDivide=*/true>(x, smooth, k, s, s, static_cast<int8_t*>(dst));
}

}  // namespace moe::quant_detail
