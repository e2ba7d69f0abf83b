// AVX-512 grouped-GEMM kernels (compiled with -mavx512f/bw/vl/dq/bf16/vnni -mfma; called
// only after runtime detection). Layout: grouped_gemm_impl.h.
//
// One register-blocked microkernel serves both regimes:
//   MR rows (1..6) x 64 columns = MR x 4 zmm f32 accumulators, over the whole K of a
//   panel. Per k step (bf16: a k pair) it loads the panel's 4 zmm (256 contiguous bytes)
//   once and reuses them for MR rows, each row's A element (pair) broadcast from memory.
//   MR=6 -> 24 accumulators + 4 B registers + 1 broadcast = 29 of the 32 zmm.
// Decode (<= 4 rows per expert): each weight byte is read exactly once, straight from
//   DRAM; the loop is bandwidth-bound and software prefetch runs kPrefetchBytes ahead.
// Prefill: a task is (expert, one panel); the panel (K*256 B bf16 pairs: 256 KiB at
//   K=2048) is streamed from DRAM by the first row block (with prefetch) and re-read
//   from L2 (1 MiB on Zen4) by the next ones, so the loop is bound by vdpbf16ps issue.
// Epilogue: the gated activation act(gate) * up on the f32 accumulators (gate columns in
// zmm 0-1, up in zmm 2-3), masked stores for the tail panel, RNE rounding to bf16.
// FP8 weights (run_task_f8_avx512bf16): the same microkernel on panels dequantised to
// bf16 by grouped_gemm_fp8_avx512.cpp for prefill; decode converts in registers.

// GCC 12 reports its own _mm512_undefined_*() self-initialisation inside the intrinsic
// headers as maybe-uninitialized (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

enum class Kind { F32, Bf16Dp, Bf16Emu };

template <Kind KD>
constexpr int kMaxRows = KD == Kind::Bf16Emu ? 4 : 6;

template <int D, _mm_hint H>
inline void prefetch_step(const char* p) {
  _mm_prefetch(p + D, H);
  _mm_prefetch(p + D + 64, H);
  _mm_prefetch(p + D + 128, H);
  _mm_prefetch(p + D + 192, H);
}

inline uint32_t load_u32(const char* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}
inline uint32_t load_u16(const char* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  return u;
}

// acc[r][q] += A rows x panel over k steps [s0, s1) (bf16: k pairs), f32 accumulation.
// PFD > 0: software-prefetch the panel stream PFD bytes ahead, into the cache level H.
template <Kind KD, int MR, int PFD, _mm_hint H = _MM_HINT_T0>
inline void microkernel(const Job& j, const char* panel, const char* a0, int64_t s0, int64_t s1,
                        __m512 (&acc)[MR][4]) {
  const char* ar[MR];
  for (int r = 0; r < MR; ++r) ar[r] = a0 + r * j.lda_bytes;
  const int64_t K = j.k;
  if constexpr (KD == Kind::F32) {
    for (int64_t k = s0; k < s1; ++k) {
      const char* bp = panel + k * 256;
      if constexpr (PFD > 0) prefetch_step<PFD, H>(bp);
      const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 64);
      const __m512 b2 = _mm512_load_ps(bp + 128), b3 = _mm512_load_ps(bp + 192);
      for (int r = 0; r < MR; ++r) {
        const __m512 a = _mm512_set1_ps(reinterpret_cast<const float*>(ar[r])[k]);
        acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(a, b2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(a, b3, acc[r][3]);
      }
    }
  } else {
    const int64_t Kf = K / 2;
    for (int64_t p = s0; p < s1; ++p) {
      const char* bp = panel + p * 256;
      if constexpr (PFD > 0) prefetch_step<PFD, H>(bp);
      const __m512i b0 = _mm512_load_si512(bp), b1 = _mm512_load_si512(bp + 64);
      const __m512i b2 = _mm512_load_si512(bp + 128), b3 = _mm512_load_si512(bp + 192);
      // A pair (a[2p], a[2p+1]) as one 32-bit lane; an odd K's last pair is (a[K-1], 0).
      uint32_t u[MR];
      if (p < Kf) [[likely]] {
        for (int r = 0; r < MR; ++r) u[r] = load_u32(ar[r] + 4 * p);
      } else {
        for (int r = 0; r < MR; ++r) u[r] = load_u16(ar[r] + 4 * p);
      }
      if constexpr (KD == Kind::Bf16Dp) {
        for (int r = 0; r < MR; ++r) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(u[r]));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, (__m512bh)b0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, (__m512bh)b1);
          acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, (__m512bh)b2);
          acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, (__m512bh)b3);
        }
      } else {  // bf16 -> f32 is a 16-bit shift: even k = low half << 16, odd k = high half.
        const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
        const __m512i bs[4] = {b0, b1, b2, b3};
        for (int q = 0; q < 4; ++q) {
          const __m512 be = _mm512_castsi512_ps(_mm512_slli_epi32(bs[q], 16));
          const __m512 bo = _mm512_castsi512_ps(_mm512_and_si512(bs[q], hi));
          for (int r = 0; r < MR; ++r) {
            const __m512 ae = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(u[r] << 16)));
            const __m512 ao = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(u[r] & 0xffff0000u)));
            acc[r][q] = _mm512_fmadd_ps(ae, be, acc[r][q]);
            acc[r][q] = _mm512_fmadd_ps(ao, bo, acc[r][q]);
          }
        }
      }
    }
  }
}

// One row block x one panel over the whole K, then the epilogue. The first row block of a
// panel streams it from DRAM (with software prefetch); the others re-read it from L2.
// Decode (the only block, <= 4 rows) prefetches into L2, prefill into L1: measured on Zen4
// (qwen3-30b-a3b, 2 threads, memory at ~35 GB/s), T=1 streams 32.5 -> 34.2 GB/s with L2
// (bench_decode_ab, 3 runs each), while T=512 runs 2-3 % slower with L2 than with L1.
// (Tried: K-chunking all row blocks over 16 KiB L1-resident slices of the panel with an
// L2 prefetch of the next slice: 5-10% slower at T=128 and T=512 on Zen4.)
template <Kind KD, int MR>
void block(const Job& j, const char* panel, const char* a0, int64_t S, bool first, bool decode, char* c0, int64_t col0,
           int nv) {
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  if (first && decode)
    microkernel<KD, MR, kPrefetchBytes, _MM_HINT_T1>(j, panel, a0, 0, S, acc);
  else if (first)
    microkernel<KD, MR, kPrefetchBytes>(j, panel, a0, 0, S, acc);
  else
    microkernel<KD, MR, 0>(j, panel, a0, 0, S, acc);
  f32_epilogue<MR>(j, acc, c0, col0, nv);
}

// All rows of the task's expert x panel P (at `panel`).
template <Kind KD>
void run_panel(const Job& j, int64_t expert, int64_t P, const char* panel) {
  constexpr int kMR = kMaxRows<KD>;
  const int64_t r0 = j.offsets[expert], rows = j.offsets[expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t S = KD == Kind::F32 ? j.k : (j.k + 1) / 2;  // k steps (256 B of panel each)
  const int64_t nb = (rows + kMR - 1) / kMR;                  // row blocks of near-equal size <= kMR
  const int nv = valid_cols(j, P);
  const int64_t c0 = P * per;
  int64_t row = r0;
  for (int64_t b = 0; b < nb; ++b) {
    const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
    const char* a = j.a + row * j.lda_bytes;
    char* c = j.c + row * j.ldc_bytes;
    const bool first = b == 0, decode = rows <= kDecodeMaxRows;
    switch (mr) {
      case 1: block<KD, 1>(j, panel, a, S, first, decode, c, c0, nv); break;
      case 2: block<KD, 2>(j, panel, a, S, first, decode, c, c0, nv); break;
      case 3: block<KD, 3>(j, panel, a, S, first, decode, c, c0, nv); break;
      case 4: block<KD, 4>(j, panel, a, S, first, decode, c, c0, nv); break;
      case 5: if constexpr (kMR >= 5) block<KD, 5>(j, panel, a, S, first, decode, c, c0, nv); break;
      default: if constexpr (kMR >= 6) block<KD, 6>(j, panel, a, S, first, decode, c, c0, nv); break;
    }
    row += mr;
  }
}

// A column window (Job::col_windows): MR <= 4 decode rows x the NQ 16-column chunks from
// q0 of one f32 panel, each column the chain microkernel runs (one fma per k, in order,
// from zero), reading only the window's 64-byte pieces of each 256-byte k step.
template <int MR, int NQ>
void f32_window(const Job& j, const char* panel, const char* a0, int q0, char* c0, int64_t col0, int nv) {
  const float* ar[MR];
  for (int r = 0; r < MR; ++r) ar[r] = reinterpret_cast<const float*>(a0 + r * j.lda_bytes);
  __m512 acc[MR][NQ];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NQ; ++q) acc[r][q] = _mm512_setzero_ps();
  const char* base = panel + 64 * q0;
  for (int64_t k = 0; k < j.k; ++k) {
    const char* bp = base + k * 256;
    __m512 b[NQ];
    for (int q = 0; q < NQ; ++q) {
      _mm_prefetch(bp + kPrefetchBytes + 64 * q, _MM_HINT_T1);
      b[q] = _mm512_load_ps(bp + 64 * q);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(ar[r][k]);
      for (int q = 0; q < NQ; ++q) acc[r][q] = _mm512_fmadd_ps(a, b[q], acc[r][q]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NQ; ++q) store16(j, c0 + r * j.ldc_bytes, col0 + 16 * q, acc[r][q], col_mask(nv, 16 * q));
}

template <int NQ>
void run_f32_window(const Job& j, const Task& t) {
  static_assert(kDecodeMaxRows == 4, "the switch below covers 1..4 rows");
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const char* panel = j.w + t.expert * j.expert_stride + t.p0 * j.panel_stride;
  const char* a = j.a + r0 * j.lda_bytes;
  char* c = j.c + r0 * j.ldc_bytes;
  const int64_t col0 = t.p0 * kPanel + kWindowCols * t.q0;
  const int nv = window_cols(j, t);
  switch (rows) {
    case 1: f32_window<1, NQ>(j, panel, a, t.q0, c, col0, nv); break;
    case 2: f32_window<2, NQ>(j, panel, a, t.q0, c, col0, nv); break;
    case 3: f32_window<3, NQ>(j, panel, a, t.q0, c, col0, nv); break;
    default: f32_window<4, NQ>(j, panel, a, t.q0, c, col0, nv); break;
  }
}

template <Kind KD>
void run_task(const Job& j, const Task& t) {
  if constexpr (KD == Kind::F32) {
    if (is_window(t)) return t.q1 - t.q0 == 1 ? run_f32_window<1>(j, t) : run_f32_window<2>(j, t);
  }
  for (int64_t P = t.p0; P < t.p1; ++P) run_panel<KD>(j, t.expert, P, j.w + t.expert * j.expert_stride + P * j.panel_stride);
}

// FP8, one row block (decode): the e4m3 codes are converted to bf16 in registers
// (f8x32_to_bf16: the values dequant_pairs_f8_avx512bf16 writes) and fed straight to
// vdpbf16ps in the bf16 kernel's order, so the result equals the bf16 kernel on the
// dequantised panel bit for bit, without storing and reloading the panel. MR <= 4
// (kDecodeMaxRows): 16
// accumulators + 8 scale vectors + 4 converted operands fit in the 32 zmm.
template <int MR>
void f8_decode_block(const Job& j, int64_t expert, int64_t P, const char* a0, char* c0, int64_t col0, int nv) {
  const char* src = j.w + expert * j.expert_stride + P * j.panel_stride;
  const float* sc = j.f8_scale + expert * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel;
  const char* ar[MR];
  for (int r = 0; r < MR; ++r) ar[r] = a0 + r * j.lda_bytes;
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  // FP8 k is a multiple of the (even) block width: no half pair at the end.
  for (int64_t kb = 0; kb < j.f8_n_kb; ++kb) {
    __m512 s[8];
    f8_block_scales(sc, kb, s);
    for (int64_t p = kb * j.f8_kb_pairs; p < (kb + 1) * j.f8_kb_pairs; ++p) {
      const char* in = src + p * 2 * kPanel;
      _mm_prefetch(in + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(in + kPrefetchBytes + 64, _MM_HINT_T0);
      __m512i b[4];
      for (int h = 0; h < 4; ++h) b[h] = f8x32_to_bf16(in + 32 * h, s[2 * h], s[2 * h + 1]);
      for (int r = 0; r < MR; ++r) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(load_u32(ar[r] + 4 * p)));
        for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], a, (__m512bh)b[q]);
      }
    }
  }
  f32_epilogue<MR>(j, acc, c0, col0, nv);
}

}  // namespace

void run_task_avx512_f32(const Job& j, const Task& t) { run_task<Kind::F32>(j, t); }
void run_task_avx512_bf16emu(const Job& j, const Task& t) { run_task<Kind::Bf16Emu>(j, t); }
void run_task_avx512bf16(const Job& j, const Task& t) { run_task<Kind::Bf16Dp>(j, t); }

void run_task_f8_avx512bf16(const Job& j, const Task& t, char* buf) {
  static_assert(kDecodeMaxRows == 4, "the decode switch below covers 1..4 rows");
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t S = (j.k + 1) / 2;
  const int64_t per = j.gated ? kGateCols : kPanel;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    if (rows > kDecodeMaxRows) {  // prefill: dequantise the whole panel once for all row blocks
      dequant_pairs_f8_avx512bf16(j, t.expert, P, 0, S, reinterpret_cast<uint16_t*>(buf));
      run_panel<Kind::Bf16Dp>(j, t.expert, P, buf);
      continue;
    }
    const char* a = j.a + r0 * j.lda_bytes;
    char* c = j.c + r0 * j.ldc_bytes;
    const int nv = valid_cols(j, P);
    switch (rows) {
      case 1: f8_decode_block<1>(j, t.expert, P, a, c, P * per, nv); break;
      case 2: f8_decode_block<2>(j, t.expert, P, a, c, P * per, nv); break;
      case 3: f8_decode_block<3>(j, t.expert, P, a, c, P * per, nv); break;
      default: f8_decode_block<4>(j, t.expert, P, a, c, P * per, nv); break;
    }
  }
}

}  // namespace moe::gg
