// AVX-512 loops of the machine-limit probes (see probes.h). Compiled with AVX-512 flags;
// called only when the CPU has the features.
// GCC 12 reports its own _mm512_undefined_*() self-initialisation inside the intrinsic
// headers as maybe-uninitialized (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "kernels/probes_impl.h"

namespace moe::probes {

uint64_t read_sum_avx512(const char* p, size_t bytes) {
  // 4 independent zmm XOR chains, 256 bytes per iteration: the loads are the only cost.
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  const size_t n = bytes / 256;
  for (size_t i = 0; i < n; ++i) {
    const char* q = p + i * 256;
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(q));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(q + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(q + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(q + 192));
  }
  const __m512i s = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(s));
}

// The chains below keep kChains accumulators in registers; the empty asm with the
// accumulators as in/out operands stops the compiler from shortening the chains.

double bf16_chain(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0)
  __m512bh y = (__m512bh)_mm512_set1_epi32(0x33803380);        // tiny: no overflow
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
    __asm__ volatile("" : "+v"(y));
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

double f32_chain_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f);
  __m512 a = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    __asm__ volatile("" : "+v"(a));
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

double int8_chain(int64_t iters) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i x = _mm512_set1_epi8(1);
  __m512i y = _mm512_set1_epi8(2);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], x, y);
    __asm__ volatile("" : "+v"(y));
  }
  __m512i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_epi32(s, acc[i]);
  return static_cast<double>(_mm512_reduce_add_epi32(s));
}

}  // namespace moe::probes
