// W8A8 grouped-GEMM task runner on AVX512-VNNI (vpdpbusd). Layout: grouped_gemm_impl.h.
//
// vpdpbusd multiplies UNSIGNED bytes of its first source by SIGNED bytes of the second,
// summing groups of 4 into int32 lanes. The activations are signed int8, so each A quad
// is XORed with 0x80808080 (q + 128 as u8, done on the 32-bit scalar before the
// broadcast: free next to the 4 vpdpbusd it feeds per row) and the epilogue subtracts the
// per-column compensation 128 * sum_k q_w[col, k] computed at pack time. The int32 result
// equals sum q_a * q_w exactly (no overflow: |sum| <= K * 255 * 127 < 2^31 for K < 66k).
//
// Same blocking as the bf16 kernel: MR (<= 6) rows x 64 columns = MR x 4 zmm int32
// accumulators, one panel k quad (256 contiguous bytes, 4 zmm) per step reused by MR
// rows. Decode streams each weight byte once (half the bytes of bf16), prefill re-reads
// the panel (K/4 * 256 B = 128 KiB at K = 2048) from L2 for the later row blocks.
// Epilogue: (float)(acc - comp) * a_scale[row] * w_scale[col], the gated activation on
// the f32 values (ActMath, the same operations as the portable runner), store.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

constexpr int kMR = 6;
// The weight stream is prefetched into L2 (prefetcht1), not L1 (prefetcht0). Measured on
// the Zen 4 VM (decode T=1, qwen3-30b-a3b, 1 thread, bf16 and int8 calls interleaved,
// load ~5): int8 GEMM1 streamed at 29-30 GB/s with T0 (the bf16 kernel: 31-32), 32-35 GB/s
// with T1 or T2 (both fill L2 on Zen 4) and 30-32 GB/s with no software prefetch; T1 at 2
// or 8 KiB ahead matched 4 KiB, 16 KiB was worse (27-28 GB/s). Our reading: an L1
// prefetch holds one of the core's few L1 miss buffers until its line arrives from DRAM,
// so with 4 per 256-byte k step they, not DRAM, capped the stream; an L2 prefetch does
// not, and the demand loads then hit L2.
constexpr _mm_hint kPrefetchHint = _MM_HINT_T1;
// Column block q (16 columns) of a row: (float)(acc - comp) * a_scale * w_scale.
inline __m512 dequant(__m512i acc, const int32_t* wc, const float* ws, int q, __m512 vas) {
  const __m512i v = _mm512_sub_epi32(acc, _mm512_loadu_si512(wc + 16 * q));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), vas), _mm512_loadu_ps(ws + 16 * q));
}

// No local arrays here: with them GCC 12 stops keeping the accumulators in registers.
template <int MR>
inline void epilogue(const Job& j, const __m512i (&acc)[MR][4], const char* a0, const float* ws, const int32_t* wc,
                     char* c0, int64_t col0, int nv) {
  for (int r = 0; r < MR; ++r) {
    char* crow = c0 + r * j.ldc_bytes;
    if (j.c_dtype == DType::I32) {
      for (int q = 0; q < 4; ++q)
        if (const __mmask16 m = col_mask(nv, 16 * q))
          _mm512_mask_storeu_epi32(reinterpret_cast<int32_t*>(crow) + col0 + 16 * q, m,
                                   _mm512_sub_epi32(acc[r][q], _mm512_loadu_si512(wc + 16 * q)));
      continue;
    }
    float as;
    std::memcpy(&as, a0 + r * j.lda_bytes + j.a_scale_off, 4);
    const __m512 vas = _mm512_set1_ps(as);
    if (j.gated) {
      for (int h = 0; h < 2; ++h) {
        const __m512 g = ActMath<Avx512Ops>::gate(j.act, dequant(acc[r][h], wc, ws, h, vas));
        store16(j, crow, col0 + 16 * h, _mm512_mul_ps(g, dequant(acc[r][2 + h], wc, ws, 2 + h, vas)),
                col_mask(nv, 16 * h));
      }
    } else {
      for (int q = 0; q < 4; ++q) store16(j, crow, col0 + 16 * q, dequant(acc[r][q], wc, ws, q, vas), col_mask(nv, 16 * q));
    }
  }
}

inline uint32_t load_u32(const char* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}

// The MR x 4 accumulators are named locals, not an array: with an array (as in the bf16
// kernel) GCC 12 keeps the int32 accumulators in memory and reloads/stores every one of
// them on each k step (seen in the disassembly even at MR = 2), halving the speed.
#define MOE_I8_ROW(R)                                                                              \
  if constexpr (MR > R) {                                                                          \
    const __m512i a = _mm512_set1_epi32(static_cast<int>(load_u32(a0 + R * lda + 4 * p) ^ 0x80808080u)); \
    c##R##0 = _mm512_dpbusd_epi32(c##R##0, a, b0);                                                 \
    c##R##1 = _mm512_dpbusd_epi32(c##R##1, a, b1);                                                 \
    c##R##2 = _mm512_dpbusd_epi32(c##R##2, a, b2);                                                 \
    c##R##3 = _mm512_dpbusd_epi32(c##R##3, a, b3);                                                 \
  }

template <int MR, int PFD>
inline void microkernel(const Job& j, const char* panel, const char* a0, int64_t S, __m512i (&acc)[MR][4]) {
  const int64_t lda = j.lda_bytes;
  const __m512i z = _mm512_setzero_si512();
  __m512i c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z, c23 = z;
  __m512i c30 = z, c31 = z, c32 = z, c33 = z, c40 = z, c41 = z, c42 = z, c43 = z, c50 = z, c51 = z, c52 = z, c53 = z;
  for (int64_t p = 0; p < S; ++p) {
    const char* bp = panel + p * 256;
    if constexpr (PFD > 0) {
      _mm_prefetch(bp + PFD, kPrefetchHint);
      _mm_prefetch(bp + PFD + 64, kPrefetchHint);
      _mm_prefetch(bp + PFD + 128, kPrefetchHint);
      _mm_prefetch(bp + PFD + 192, kPrefetchHint);
    }
    const __m512i b0 = _mm512_load_si512(bp), b1 = _mm512_load_si512(bp + 64);
    const __m512i b2 = _mm512_load_si512(bp + 128), b3 = _mm512_load_si512(bp + 192);
    MOE_I8_ROW(0)
    MOE_I8_ROW(1)
    MOE_I8_ROW(2)
    MOE_I8_ROW(3)
    MOE_I8_ROW(4)
    MOE_I8_ROW(5)
  }
  const __m512i all[6][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23},
                             {c30, c31, c32, c33}, {c40, c41, c42, c43}, {c50, c51, c52, c53}};
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = all[r][q];
}
#undef MOE_I8_ROW

template <int MR>
void block(const Job& j, const char* panel, const char* a0, int64_t S, bool first, const float* ws, const int32_t* wc,
           char* c0, int64_t col0, int nv) {
  __m512i acc[MR][4];
  if (first)
    microkernel<MR, kPrefetchBytes>(j, panel, a0, S, acc);
  else
    microkernel<MR, 0>(j, panel, a0, S, acc);
  epilogue<MR>(j, acc, a0, ws, wc, c0, col0, nv);
}

}  // namespace

void run_task_avx512_vnni_i8(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t S = (j.k + 3) / 4;
  const int64_t nb = (rows + kMR - 1) / kMR;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    const char* panel = j.w + t.expert * j.expert_stride + P * j.panel_stride;
    const float* ws = j.w_scale + t.expert * j.q_stride + P * kPanel;
    const int32_t* wc = j.w_comp + t.expert * j.q_stride + P * kPanel;
    const int nv = valid_cols(j, P);
    const int64_t c0 = P * per;
    int64_t row = r0;
    for (int64_t b = 0; b < nb; ++b) {
      const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
      const char* a = j.a + row * j.lda_bytes;
      char* c = j.c + row * j.ldc_bytes;
      const bool first = b == 0;
      switch (mr) {
        case 1: block<1>(j, panel, a, S, first, ws, wc, c, c0, nv); break;
        case 2: block<2>(j, panel, a, S, first, ws, wc, c, c0, nv); break;
        case 3: block<3>(j, panel, a, S, first, ws, wc, c, c0, nv); break;
        case 4: block<4>(j, panel, a, S, first, ws, wc, c, c0, nv); break;
        case 5: block<5>(j, panel, a, S, first, ws, wc, c, c0, nv); break;
        default: block<6>(j, panel, a, S, first, ws, wc, c, c0, nv); break;
      }
      row += mr;
    }
  }
}

}  // namespace moe::gg
