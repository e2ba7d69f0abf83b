// FP8 E4M3 -> bf16 panel dequantisation with AVX-512 (compiled with the AVX-512 BF16
// flags; called only when the CPU has them). Layout and contract: grouped_gemm_fp8.cpp;
// the conversion itself (f8x32_to_bf16) is in grouped_gemm_avx512_common.h, shared with
// the decode kernel that converts in registers. Per 32 values: 1 widening load, 1 shift,
// 1 and, 2 vcvtph2ps, 2 multiplies, 1 convert, 1 store.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {

void dequant_pairs_f8_avx512bf16(const Job& j, int64_t e, int64_t P, int64_t p0, int64_t p1, uint16_t* dst) {
  const char* src = j.w + e * j.expert_stride + P * j.panel_stride;
  const float* sc = j.f8_scale + e * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel;
  char* out = reinterpret_cast<char*>(dst);
  for (int64_t pp = p0; pp < p1;) {
    const int64_t kb = pp / j.f8_kb_pairs, end = (kb + 1) * j.f8_kb_pairs < p1 ? (kb + 1) * j.f8_kb_pairs : p1;
    __m512 s[8];
    f8_block_scales(sc, kb, s);
    for (; pp < end; ++pp) {
      const char* in = src + pp * 2 * kPanel;  // 128 bytes: 64 columns x 2 k
      _mm_prefetch(in + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(in + kPrefetchBytes + 64, _MM_HINT_T0);
      for (int h = 0; h < 4; ++h)
        _mm512_store_si512(out + pp * 4 * kPanel + 64 * h, f8x32_to_bf16(in + 32 * h, s[2 * h], s[2 * h + 1]));
    }
  }
}

}  // namespace moe::gg
