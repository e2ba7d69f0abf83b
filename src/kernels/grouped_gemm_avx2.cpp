// AVX2 + FMA grouped-GEMM kernels for f32 and bf16 weights (compiled with -mavx2 -mfma
// -mf16c; called only after runtime detection). Layout: grouped_gemm_impl.h.
//
// Numbers: per column and row, one f32 accumulator chain over k in order 0..K-1, one
// explicit FMA per product (bf16: the even k of a pair, then the odd k) -- the exact
// operation sequence of the AVX-512 f32 and bf16-emulation kernels, so on the same input
// these kernels give the same bits as those (tests: GroupedGemmAvx2.*), and a row's
// result does not depend on the other rows of the call (batch invariance).
//
// Blocking: 16 ymm registers. A microkernel computes MR rows x NQ ymm (8 columns each)
// of a 64-column panel over the whole K, MR * NQ <= 8 accumulators:
//   MR 1 -> NQ 8 (the whole panel in one pass: one contiguous weight stream, decode),
//   MR 2 -> NQ 4 (two passes over the panel's column halves),
//   MR 3, 4 -> NQ 2 (four passes of 16 columns: per k (pair) 2 weight loads and 4 (8)
//   broadcasts for 8 (16) FMAs, so the FMA ports, not the loads, set the pace).
// Not the classic 6 x 16 tile with 12 accumulators: with the bf16 widening temporaries
// GCC 12 spilled accumulators to the stack in every k step (seen in the disassembly).
// A pass reads only its own cache lines of each 256-byte panel row, so every weight byte
// still comes from DRAM once per row block; later row blocks re-read the panel from L2.
// bf16 weights: a ymm of the panel holds 8 columns x one k pair; the even k is the low
// half shifted left by 16, the odd k the high half masked -- two integer ops per 16
// weights, amortised over MR rows. bf16 activations are widened once per row block into
// a per-thread scratch of f32 rows, so the inner loop broadcasts from memory.
// Decode (<= kDecodeMaxRows rows) prefetches the stream into L2, prefill's first row block
// into L1 (as the AVX-512 kernels, measured there).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/grouped_gemm_avx2_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

enum class Kind { F32, Bf16, F8 };  // F8: e4m3 codes converted in registers (decode)

constexpr int kMaxRows = 4;
constexpr int64_t kChunkSteps = 256;

constexpr int nq_for(int mr) { return mr == 1 ? 8 : mr == 2 ? 4 : 2; }

// The A operand of one row block as f32 rows, row r at f32 + r * lda: f32 activations
// read in place, bf16 ones widened into a per-thread scratch (rows of 2 ceil(K/2) floats).
struct ABlock {
  const float* f32 = nullptr;
  int64_t lda = 0;  // floats
};

// The B operand: a panel of the packed weights; F8 also its block scales (PackedExperts::
// w_scale of this panel: per k block 128 floats, the scale of each byte of a k-pair row).
struct BPanel {
  const char* w = nullptr;
  const float* f8_scale = nullptr;
  int64_t f8_kb_pairs = 0;  // k pairs per scale block
};

// FP8: 16 e4m3 codes (8 columns x one k pair of a panel row) and their 16 scales -> the
// bf16 values the bf16 kernel would load for them, as f32 (even k, odd k of the 8
// columns): bf16(value * scale) rounded to nearest even, exactly dequant_panel_portable's
// values, without storing the panel. As the AVX-512 conversion: the sign-extended byte
// shifted left by 7 with bit 14 cleared is the f16 of value * 2^-8 (subnormals included);
// vcvtph2ps widens it exactly and * 2^8 restores it exactly, so the multiply by the scale
// rounds once like value * scale. Scales are limited at pack time so no product is
// subnormal or infinite (fp8 pack_expert_fp8), and no code is NaN: the rounding needs no
// NaN case.
inline __m256 round_to_bf16_f32(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline void f8x16_dequant(const char* in, const float* sc, __m256& lo, __m256& hi) {
  const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
  const __m256i f16 = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
  const __m256 c256 = _mm256_set1_ps(256.0f);
  lo = round_to_bf16_f32(_mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(f16)), c256), _mm256_loadu_ps(sc)));
  hi = round_to_bf16_f32(_mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1)), c256), _mm256_loadu_ps(sc + 8)));
}
inline void f8x16_to_pairs(const char* in, const float* sc, __m256& be, __m256& bo) {
  __m256 lo, hi;  // lo: columns 0-3 as (even, odd) pairs, hi: columns 4-7
  f8x16_dequant(in, sc, lo, hi);
  // shuffle_ps picks the even (odd) lanes per 128-bit half: columns 0 1 4 5 | 2 3 6 7;
  // the 64-bit permute puts them in order.
  be = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xd8));
  bo = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd)), 0xd8));
}

template <int PFH>
inline void prefetch_lines(const char* p, int lines) {
  for (int i = 0; i < lines; ++i) _mm_prefetch(p + 64 * i, static_cast<_mm_hint>(PFH));
}

// tile[r][8 q0 .. 8 (q0 + NQ)) (+)= A rows x panel columns over the k steps [s0, s1):
// resume continues the accumulators stored in the tile (the next k chunk of the same
// chains, so the chunking does not change a bit). PFD > 0: prefetch the pass's lines
// PFD bytes ahead with hint PFH.
template <Kind KD, int MR, int NQ, int PFD, int PFH>
inline void microkernel(const BPanel& bpanel, const ABlock& ab, int64_t s0, int64_t s1, int q0, bool resume,
                        float* tile) {
  const char* panel = bpanel.w;
  __m256 acc[MR][NQ];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NQ; ++q)
      acc[r][q] = resume ? _mm256_load_ps(tile + r * kPanel + 8 * (q0 + q)) : _mm256_setzero_ps();
  if constexpr (KD == Kind::F8) {  // a k-pair row is 128 bytes of codes: 16 per ymm column
    constexpr int kLines = NQ * 16 / 64 > 0 ? NQ * 16 / 64 : 1;
    const char* base = panel + q0 * 16;
    for (int64_t p = s0; p < s1; ++p) {
      const char* bp = base + p * 128;
      if constexpr (PFD > 0) prefetch_lines<PFH>(bp + PFD, kLines);
      const float* sc = bpanel.f8_scale + (p / bpanel.f8_kb_pairs) * 2 * kPanel + q0 * 16;
      const float* ap = ab.f32 + 2 * p;
      for (int q = 0; q < NQ; ++q) {
        __m256 be, bo;
        f8x16_to_pairs(bp + 16 * q, sc + 16 * q, be, bo);
        for (int r = 0; r < MR; ++r) {
          acc[r][q] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + r * ab.lda), be, acc[r][q]);
          acc[r][q] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + r * ab.lda + 1), bo, acc[r][q]);
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int q = 0; q < NQ; ++q) _mm256_store_ps(tile + r * kPanel + 8 * (q0 + q), acc[r][q]);
    return;
  }
  constexpr int kLines = NQ * 32 / 64 > 0 ? NQ * 32 / 64 : 1;
  const char* base = panel + q0 * 32;
  if constexpr (KD == Kind::F32) {
    for (int64_t k = s0; k < s1; ++k) {
      const float* bp = reinterpret_cast<const float*>(base + k * 256);
      if constexpr (PFD > 0) prefetch_lines<PFH>(base + k * 256 + PFD, kLines);
      if constexpr (MR == 1) {  // NQ = 8: the loads fold into the FMAs, one use each
        const __m256 a = _mm256_broadcast_ss(ab.f32 + k);
        for (int q = 0; q < NQ; ++q) acc[0][q] = _mm256_fmadd_ps(a, _mm256_load_ps(bp + 8 * q), acc[0][q]);
      } else {  // load each weight vector once for all rows (folded, it would be loaded MR times)
        __m256 b[NQ];
        for (int q = 0; q < NQ; ++q) b[q] = _mm256_load_ps(bp + 8 * q);
        for (int r = 0; r < MR; ++r) {
          const __m256 a = _mm256_broadcast_ss(ab.f32 + r * ab.lda + k);
          for (int q = 0; q < NQ; ++q) acc[r][q] = _mm256_fmadd_ps(a, b[q], acc[r][q]);
        }
      }
    }
  } else {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    for (int64_t p = s0; p < s1; ++p) {
      const char* bp = base + p * 256;
      if constexpr (PFD > 0) prefetch_lines<PFH>(bp + PFD, kLines);
      const float* ap = ab.f32 + 2 * p;
      // Loop order by register pressure (GCC keeps every value of the inner loop live):
      // few rows widen one weight vector at a time for all rows; more rows widen the
      // pass's NQ = 2 vectors first and stream the rows' broadcasts past them.
      if constexpr (MR <= 2) {
        for (int q = 0; q < NQ; ++q) {
          const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + 32 * q));
          const __m256 be = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
          const __m256 bo = _mm256_castsi256_ps(_mm256_and_si256(b, hi));
          for (int r = 0; r < MR; ++r) {
            acc[r][q] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + r * ab.lda), be, acc[r][q]);
            acc[r][q] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + r * ab.lda + 1), bo, acc[r][q]);
          }
        }
      } else {
        __m256 be[NQ], bo[NQ];
        for (int q = 0; q < NQ; ++q) {
          const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + 32 * q));
          be[q] = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
          bo[q] = _mm256_castsi256_ps(_mm256_and_si256(b, hi));
        }
        for (int r = 0; r < MR; ++r) {
          const __m256 ae = _mm256_broadcast_ss(ap + r * ab.lda), ao = _mm256_broadcast_ss(ap + r * ab.lda + 1);
          for (int q = 0; q < NQ; ++q) {
            acc[r][q] = _mm256_fmadd_ps(ae, be[q], acc[r][q]);
            acc[r][q] = _mm256_fmadd_ps(ao, bo[q], acc[r][q]);
          }
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NQ; ++q) _mm256_store_ps(tile + r * kPanel + 8 * (q0 + q), acc[r][q]);
}

// One row block x one panel: all passes, then the epilogue of each row.
template <Kind KD, int MR>
void block(const Job& j, const BPanel& panel, const ABlock& ab, int64_t S, bool first, bool decode, char* c0,
           int64_t col0, int nv) {
  // FP8's in-register conversion needs ~6 temporaries: narrower passes keep it spill-free.
  constexpr int NQ = KD == Kind::F8 ? (MR == 1 ? 4 : MR <= 3 ? 2 : 1) : nq_for(MR);
  alignas(32) float tile[MR * kPanel];
  // Several passes: K in chunks of kChunkSteps, so one pass's weights (64 B per step) and
  // the rows' activations (8 B per step and row) stay in the 32 KiB L1 between passes.
  const int64_t chunk = NQ == 8 ? S : kChunkSteps;
  for (int64_t s0 = 0; s0 < S; s0 += chunk) {
    const int64_t s1 = std::min(S, s0 + chunk);
    for (int q0 = 0; q0 < 8; q0 += NQ) {
      if (first && decode)
        microkernel<KD, MR, NQ, kAvx2PrefetchBytes, _MM_HINT_T1>(panel, ab, s0, s1, q0, s0 > 0, tile);
      else if (first)
        microkernel<KD, MR, NQ, kAvx2PrefetchBytes, _MM_HINT_T0>(panel, ab, s0, s1, q0, s0 > 0, tile);
      else
        microkernel<KD, MR, NQ, 0, 0>(panel, ab, s0, s1, q0, s0 > 0, tile);
    }
  }
  for (int r = 0; r < MR; ++r) avx2_epilogue_row(j, tile + r * kPanel, c0 + r * j.ldc_bytes, col0, nv);
}

// Widens rows [row, row + mr) of bf16 A to f32 rows of 2S floats in the scratch (an odd
// K's last pair gets a zero odd half, as the packed weights have a zero k there).
void widen_bf16_rows(const Job& j, int64_t row, int mr, std::vector<float>& scratch) {
  const int64_t S = (j.k + 1) / 2, ld = 2 * S;
  scratch.resize(static_cast<size_t>(ld * mr));
  for (int r = 0; r < mr; ++r) {
    const auto* a = reinterpret_cast<const uint16_t*>(j.a + (row + r) * j.lda_bytes);
    float* d = scratch.data() + r * ld;
    int64_t k = 0;
    for (; k + 8 <= j.k; k += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k));
      _mm256_storeu_ps(d + k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
    for (; k < j.k; ++k) {
      const uint32_t u = static_cast<uint32_t>(a[k]) << 16;
      std::memcpy(d + k, &u, 4);
    }
    if (j.k & 1) d[j.k] = 0.0f;
  }
}

// A column window (Job::col_windows): MR <= 4 decode rows x the NQ ymm of f32 panel
// columns from 16 q0, the chains block's passes run, stored straight to C.
template <int MR, int NQ>
void f32_window(const Job& j, const Task& t, const ABlock& ab, const BPanel& panel, char* c0) {
  alignas(32) float tile[MR * kPanel];
  microkernel<Kind::F32, MR, NQ, kAvx2PrefetchBytes, _MM_HINT_T1>(panel, ab, 0, j.k, 2 * t.q0, false, tile);
  const int64_t col0 = t.p0 * kPanel + kWindowCols * t.q0;
  const size_t bytes = static_cast<size_t>(window_cols(j, t)) * sizeof(float);
  for (int r = 0; r < MR; ++r)
    std::memcpy(reinterpret_cast<float*>(c0 + r * j.ldc_bytes) + col0, tile + r * kPanel + kWindowCols * t.q0, bytes);
}

template <int NQ>
void run_f32_window(const Job& j, const Task& t) {
  static_assert(kDecodeMaxRows == 4, "the switch below covers 1..4 rows");
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  ABlock ab;
  ab.f32 = reinterpret_cast<const float*>(j.a + r0 * j.lda_bytes);
  ab.lda = j.lda_bytes / 4;
  BPanel panel;
  panel.w = j.w + t.expert * j.expert_stride + t.p0 * j.panel_stride;
  char* c = j.c + r0 * j.ldc_bytes;
  switch (rows) {
    case 1: f32_window<1, NQ>(j, t, ab, panel, c); break;
    case 2: f32_window<2, NQ>(j, t, ab, panel, c); break;
    case 3: f32_window<3, NQ>(j, t, ab, panel, c); break;
    default: f32_window<4, NQ>(j, t, ab, panel, c); break;
  }
}

template <Kind KD>
void run_task(const Job& j, const Task& t) {
  if constexpr (KD == Kind::F32) {
    if (is_window(t)) return t.q1 - t.q0 == 1 ? run_f32_window<2>(j, t) : run_f32_window<4>(j, t);
  }
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t S = KD == Kind::F32 ? j.k : (j.k + 1) / 2;  // k steps (256 B of panel each)
  const int64_t nb = (rows + kMaxRows - 1) / kMaxRows;        // row blocks of near-equal size <= kMaxRows
  const bool decode = rows <= kDecodeMaxRows;
  thread_local std::vector<float> scratch;
  int64_t row = r0;
  for (int64_t b = 0; b < nb; ++b) {
    const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
    ABlock ab;
    if constexpr (KD == Kind::F32) {
      ab.f32 = reinterpret_cast<const float*>(j.a + row * j.lda_bytes);
      ab.lda = j.lda_bytes / 4;
    } else {
      widen_bf16_rows(j, row, mr, scratch);
      ab.f32 = scratch.data();
      ab.lda = 2 * ((j.k + 1) / 2);
    }
    char* c = j.c + row * j.ldc_bytes;
    for (int64_t P = t.p0; P < t.p1; ++P) {
      BPanel panel;
      panel.w = j.w + t.expert * j.expert_stride + P * j.panel_stride;
      if constexpr (KD == Kind::F8) {
        panel.f8_scale = j.f8_scale + t.expert * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel;
        panel.f8_kb_pairs = j.f8_kb_pairs;
      }
      const int nv = valid_cols(j, P);
      const bool first = b == 0;
      switch (mr) {
        case 1: block<KD, 1>(j, panel, ab, S, first, decode, c, P * per, nv); break;
        case 2: block<KD, 2>(j, panel, ab, S, first, decode, c, P * per, nv); break;
        case 3: block<KD, 3>(j, panel, ab, S, first, decode, c, P * per, nv); break;
        default: block<KD, 4>(j, panel, ab, S, first, decode, c, P * per, nv); break;
      }
    }
    row += mr;
  }
}

}  // namespace

void run_task_avx2_f32(const Job& j, const Task& t) { run_task<Kind::F32>(j, t); }
void run_task_avx2_bf16(const Job& j, const Task& t) { run_task<Kind::Bf16>(j, t); }

void dequant_pairs_f8_avx2(const Job& j, int64_t e, int64_t P, int64_t p0, int64_t p1, uint16_t* dst) {
  const char* src = j.w + e * j.expert_stride + P * j.panel_stride;
  const float* sc = j.f8_scale + e * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel;
  for (int64_t p = p0; p < p1; ++p) {
    const float* s = sc + (p / j.f8_kb_pairs) * 2 * kPanel;
    for (int i = 0; i < 2 * kPanel; i += 16) {
      __m256 lo, hi;
      f8x16_dequant(src + p * 2 * kPanel + i, s + i, lo, hi);
      // bf16 bits of bytes 0-7 and 8-15; packus interleaves the 128-bit halves, the
      // permute restores byte order.
      const __m256i pk = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                             _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + p * 2 * kPanel + i), _mm256_permute4x64_epi64(pk, 0xd8));
    }
  }
}

void run_task_f8_avx2(const Job& j, const Task& t, char* buf) {
  const int64_t rows = j.offsets[t.expert + 1] - j.offsets[t.expert];
  if (rows <= kDecodeMaxRows) return run_task<Kind::F8>(j, t);
  // Prefill: dequantise each panel once into the bf16 buffer and run the bf16 kernel on
  // it for all row blocks (strides 0: every (expert, panel) resolves to the buffer).
  Job bj = j;
  bj.w = buf;
  bj.expert_stride = 0;
  bj.panel_stride = 0;
  for (int32_t P = t.p0; P < t.p1; ++P) {
    dequant_pairs_f8_avx2(j, t.expert, P, 0, (j.k + 1) / 2, reinterpret_cast<uint16_t*>(buf));
    run_task<Kind::Bf16>(bj, Task{t.expert, P, P + 1});
  }
}

}  // namespace moe::gg
