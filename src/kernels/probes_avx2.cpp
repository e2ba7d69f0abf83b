// AVX2 loops of the machine-limit probes (see probes.h). Compiled with -mavx2 -mfma
// -mf16c; called only when the CPU has AVX2 + FMA (active_isa() >= Isa::Avx2).
#include <immintrin.h>

#include "kernels/probes_impl.h"

namespace moe::probes {

uint64_t read_sum_avx2(const char* p, size_t bytes) {
  // 4 independent ymm XOR chains, 256 bytes (8 loads) per iteration: the loads are the
  // only cost, as in a decode GEMV's weight stream.
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  const size_t n = bytes / 256;
  for (size_t i = 0; i < n; ++i) {
    const char* q = p + i * 256;
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(q)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 96)));
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 128)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 160)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 192)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 224)));
  }
  const __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0) ^ _mm256_extract_epi64(s, 1) ^
                               _mm256_extract_epi64(s, 2) ^ _mm256_extract_epi64(s, 3));
}

double f32_chain_avx2(int64_t iters) {
  // kAvx2Chains accumulators + the two operands fill 14 of the 16 ymm registers.
  __m256 acc[kAvx2Chains];
  for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f);
  __m256 a = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
    __asm__ volatile("" : "+x"(a));  // opaque each iteration: no folding of the chains
  }
  __m256 s = acc[0];
  for (int i = 1; i < kAvx2Chains; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  return static_cast<double>(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]);
}

double int8_chain_avx2(int64_t iters, const char* w) {
  // What an AVX2 W8A8 kernel runs per 32 weight bytes of one output column: s8 weights
  // w and s8 activations a, with |a| precomputed once per activation row (u8):
  //   vmovdqu w; vpsignb w, a (w * sign(a)); vpmaddubsw |a|, that (16 x s16 pair sums);
  //   vpmaddwd that, ones (8 x s32); vpaddd acc.
  // = 32 multiply-adds (64 ops). The weights come from `w` (kInt8Chains x 32 bytes,
  // L1-resident), as the kernel loads its panel; the pointer is made opaque each
  // iteration so the loads and everything after them are redone.
  __m256i acc[kInt8Chains];
  for (int i = 0; i < kInt8Chains; ++i) acc[i] = _mm256_setzero_si256();
  const __m256i a = _mm256_set1_epi8(-3);
  const __m256i abs_a = _mm256_abs_epi8(a);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kInt8Chains; ++i) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * i));
      const __m256i sw = _mm256_sign_epi8(wv, a);
      const __m256i p16 = _mm256_maddubs_epi16(abs_a, sw);
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p16, ones));
    }
    __asm__ volatile("" : "+r"(w));
  }
  __m256i s = acc[0];
  for (int i = 1; i < kInt8Chains; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int32_t v[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), s);
  int64_t t = 0;
  for (int i = 0; i < 8; ++i) t += v[i];
  return static_cast<double>(t);
}

}  // namespace moe::probes
