// W8A8 grouped-GEMM task runner on AVX2 (vpmaddubsw + vpmaddwd). Layout: grouped_gemm_impl.h.
//
// AVX2 has no int8 dot product into int32 (AVX-VNNI's vpdpbusd on ymm is Alder Lake / Zen 5
// and later). vpmaddubsw multiplies UNSIGNED bytes by SIGNED bytes and adds adjacent pairs
// into SATURATING int16; activations and weights are both signed int8 in [-127, 127]
// (kernels/quant.h clamps to +-127, never -128). So per 4-byte k quad broadcast from a row:
//   u = |q_a|              (vpabsb: in [0, 127], exact as unsigned)
//   s = sign(q_w, q_a)     (vpsignb: q_w * sign(q_a), in [-127, 127]; 0 where q_a == 0)
//   u * s == q_a * q_w for each byte; a pair sum is <= 2 * 127 * 127 = 32258 < 32767, so
//   vpmaddubsw never saturates; vpmaddwd by ones widens the pairs to int32 quads.
// The int32 sums are therefore exact -- the same integers as the portable and VNNI runners
// (no +128 shift here, so no compensation) -- and the epilogue performs the same IEEE
// operations ((float)acc * a_scale * w_scale, then ActMath), so every ISA gives the same
// bits. Four integer ops per ymm of weights (32 products) and row.
//
// Blocking as the AVX2 float kernel (grouped_gemm_avx2.cpp): MR rows x NQ ymm (8 columns x
// 4 k each) of the panel, MR * NQ <= 8 int32 accumulators (the sign and madd temporaries
// need the rest of the 16 registers): MR 1 -> NQ 8, MR 2..4 -> NQ 2 (with NQ 4 at MR 2
// GCC 12 spilled accumulators to the stack).
// The weight stream is prefetched into L2 as the VNNI kernel's is (measured there).
#include <immintrin.h>

#include <cstring>

#include "kernels/grouped_gemm_avx2_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

constexpr int kMaxRows = 4;

constexpr int nq_for(int mr) { return mr == 1 ? 8 : 2; }

inline __m256i bcast_quad(const char* p) {
  int32_t u;
  std::memcpy(&u, p, 4);
  return _mm256_set1_epi32(u);
}

// acc (int32) of rows [0, MR) x panel columns [8 q0, 8 (q0 + NQ)) over the k quads [0, S),
// stored to itile[r][col].
template <int MR, int NQ, int PFD>
inline void microkernel(const char* panel, const char* a0, int64_t lda, int64_t S, int q0, int32_t* itile) {
  __m256i acc[MR][NQ];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NQ; ++q) acc[r][q] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr int kLines = NQ * 32 / 64 > 0 ? NQ * 32 / 64 : 1;
  const char* base = panel + q0 * 32;
  for (int64_t s = 0; s < S; ++s) {
    const char* bp = base + s * 256;
    if constexpr (PFD > 0)
      for (int i = 0; i < kLines; ++i) _mm_prefetch(bp + PFD + 64 * i, _MM_HINT_T1);
    for (int r = 0; r < MR; ++r) {
      const __m256i a = bcast_quad(a0 + r * lda + 4 * s);
      const __m256i ua = _mm256_abs_epi8(a);
      for (int q = 0; q < NQ; ++q) {
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + 32 * q));
        const __m256i p16 = _mm256_maddubs_epi16(ua, _mm256_sign_epi8(w, a));
        acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(p16, ones));
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NQ; ++q)
      _mm256_store_si256(reinterpret_cast<__m256i*>(itile + r * kPanel + 8 * (q0 + q)), acc[r][q]);
}

template <int MR>
void block(const Job& j, const char* panel, const char* a0, int64_t S, bool first, const float* ws, char* c0,
           int64_t col0, int nv) {
  constexpr int NQ = nq_for(MR);
  alignas(32) int32_t itile[MR * kPanel];
  for (int q0 = 0; q0 < 8; q0 += NQ) {
    if (first)
      microkernel<MR, NQ, kAvx2PrefetchBytes>(panel, a0, j.lda_bytes, S, q0, itile);
    else
      microkernel<MR, NQ, 0>(panel, a0, j.lda_bytes, S, q0, itile);
  }
  for (int r = 0; r < MR; ++r) {
    char* crow = c0 + r * j.ldc_bytes;
    const int32_t* it = itile + r * kPanel;
    if (j.c_dtype == DType::I32) {
      std::memcpy(reinterpret_cast<int32_t*>(crow) + col0, it, static_cast<size_t>(nv) * sizeof(int32_t));
      continue;
    }
    float as;
    std::memcpy(&as, a0 + r * j.lda_bytes + j.a_scale_off, 4);
    const __m256 vas = _mm256_set1_ps(as);
    alignas(32) float t[kPanel];
    for (int c = 0; c < kPanel; c += 8) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(it + c)));
      _mm256_store_ps(t + c, _mm256_mul_ps(_mm256_mul_ps(v, vas), _mm256_loadu_ps(ws + c)));
    }
    avx2_epilogue_row(j, t, crow, col0, nv);
  }
}

}  // namespace

void run_task_avx2_i8(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t S = (j.k + 3) / 4;
  const int64_t nb = (rows + kMaxRows - 1) / kMaxRows;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    const char* panel = j.w + t.expert * j.expert_stride + P * j.panel_stride;
    const float* ws = j.w_scale + t.expert * j.q_stride + P * kPanel;
    const int nv = valid_cols(j, P);
    int64_t row = r0;
    for (int64_t b = 0; b < nb; ++b) {
      const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
      const char* a = j.a + row * j.lda_bytes;
      char* c = j.c + row * j.ldc_bytes;
      switch (mr) {
        case 1: block<1>(j, panel, a, S, b == 0, ws, c, P * per, nv); break;
        case 2: block<2>(j, panel, a, S, b == 0, ws, c, P * per, nv); break;
        case 3: block<3>(j, panel, a, S, b == 0, ws, c, P * per, nv); break;
        default: block<4>(j, panel, a, S, b == 0, ws, c, P * per, nv); break;
      }
      row += mr;
    }
  }
}

}  // namespace moe::gg
