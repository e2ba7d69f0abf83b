// AVX-512 panel packer (compiled with -mavx512f/bw/vl/dq; called only when active_isa()
// >= Avx512). Same words as pack_panel_portable (pack.cpp), bit for bit.
//
// A panel is built in tiles of 16 columns x 16 steps: 16 zmm, one per source row, each
// holding that row's 16 packed words of the tile, go through a 16x16 32-bit transpose
// (3 shuffle stages) and come out as 16 panel-row pieces of 64 bytes. The 4 column
// tiles of one step block fill 16 whole panel rows (4 KiB), written with streaming
// stores: the panel is not read again during loading, and a streaming store of a whole
// 64-byte line skips the read-for-ownership a normal store does on a line not in cache
// (measured: 4.8 GB/s streaming vs 2.8 GB/s with normal stores, same setup as
// kPrefetchBlocks below but with T0 prefetch).
//
// Source reads use masked loads: past the end of a row (odd K, the last block) lanes
// read as zero and never fault, so the last row of an mmapped file is safe to read.

// GCC 12 reports its own _mm512_undefined_*() self-initialisation inside the intrinsic
// headers as (maybe-)uninitialized (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/pack_impl.h"

namespace moe::gg {
namespace {

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? 0 : __mmask16((1u << n) - 1); }
inline __mmask32 mask32(int64_t n) {
  return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? 0 : __mmask32((1u << n) - 1);
}

// f32 bits -> bf16 in the high half of each 32-bit lane, exactly as f32_to_bf16:
// NaN -> (u >> 16) | 0x40 (quiet), else u + 0x7fff + lsb (round to nearest even).
// Not vcvtneps2bf16: it flushes denormal inputs to zero, f32_to_bf16 does not.
inline __m512i round_to_bf16_hi(__m512i u) {
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x00400000));
}

// 32 bf16 values with every NaN made quiet (bit 6 set), as f32_to_bf16 does: the bits
// of a bf16 -> f32 -> bf16 round trip.
inline __m512i quiet_bf16(__m512i h) {
  const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7fff)),
                                                 _mm512_set1_epi16(static_cast<short>(0x7f80)));
  return _mm512_mask_mov_epi16(h, nan, _mm512_or_si512(h, _mm512_set1_epi16(0x40)));
}

// Two vectors of 16 f32 bits (elements 0-15 in a, 16-31 in b) -> 16 bf16 pairs:
// word i = bf16(x[2i]) | bf16(x[2i+1]) << 16, i.e. the odd 16-bit halves of (a, b).
inline __m512i pairs_bf16(__m512i a, __m512i b) {
  const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                       23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(round_to_bf16_hi(a), odd, round_to_bf16_hi(b));
}

// 16 f16 -> 16 f32 bits, exactly as f16_to_f32: vcvtph2ps is exact for every finite
// value (subnormals included) but quiets a signalling NaN; f16_to_f32 keeps NaN
// payloads as they are (sign | 0x7f800000 | mant << 13), so NaN lanes are redone.
inline __m512i f16_to_f32_bits(__m256i h) {
  const __m512i w = _mm512_cvtepu16_epi32(h);
  const __m512i cvt = _mm512_castps_si512(_mm512_cvtph_ps(h));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7c00));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16);
  const __m512i mant = _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x3ff)), 13);
  const __m512i raw = _mm512_or_si512(_mm512_or_si512(sign, mant), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(cvt, nan, raw);
}

// The 16 packed words of steps [s0, s0+16) of one source row (k elements), zero past
// the end of the row. S: source dtype, D: packed dtype.
template <DType S, DType D>
inline __m512i load_words(const void* row, int64_t s0, int64_t k) {
  if constexpr (D == DType::BF16) {
    const int64_t e0 = 2 * s0, n = k - e0;  // elements left in the row
    if constexpr (S == DType::BF16) {
      return quiet_bf16(_mm512_maskz_loadu_epi16(mask32(n), static_cast<const uint16_t*>(row) + e0));
    } else if constexpr (S == DType::F32) {
      const float* r = static_cast<const float*>(row) + e0;
      return pairs_bf16(_mm512_castps_si512(_mm512_maskz_loadu_ps(mask16(n), r)),
                        _mm512_castps_si512(_mm512_maskz_loadu_ps(mask16(n - 16), r + 16)));
    } else {
      const uint16_t* r = static_cast<const uint16_t*>(row) + e0;
      return pairs_bf16(f16_to_f32_bits(_mm256_maskz_loadu_epi16(mask16(n), r)),
                        f16_to_f32_bits(_mm256_maskz_loadu_epi16(mask16(n - 16), r + 16)));
    }
  } else {
    const int64_t n = k - s0;
    if constexpr (S == DType::F32) {
      return _mm512_maskz_loadu_epi32(mask16(n), static_cast<const float*>(row) + s0);
    } else if constexpr (S == DType::BF16) {
      const __m256i h = _mm256_maskz_loadu_epi16(mask16(n), static_cast<const uint16_t*>(row) + s0);
      return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    } else {
      return f16_to_f32_bits(_mm256_maskz_loadu_epi16(mask16(n), static_cast<const uint16_t*>(row) + s0));
    }
  }
}

// Software prefetch of the source, kPrefetchBlocks 16-step blocks ahead of the loads,
// into L2 (_MM_HINT_T1). A panel reads its 64 source rows side by side, 64 streams,
// more than the hardware prefetchers follow. Measured on the 2-vCPU Zen4 VM of
// docs/PERF_LOADER.md (bf16 -> bf16, [1536, 2048] + [2048, 768] experts, one thread,
// best of 15): no useful prefetch 3.4 GB/s, T0 (L1) 5-6 GB/s, T1 (L2) 10-14 GB/s; 2 to
// 8 blocks ahead were within noise. The hint cannot fault, so reading ahead past the
// end of a row is harmless.
constexpr int64_t kPrefetchBlocks = 4;

// In-register transpose of a 16x16 matrix of 32-bit words: r[i] lane c -> r[c] lane i.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  // Stage 1: interleave row pairs (2i, 2i+1) word by word.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // Stage 2: 64-bit interleave of the pairs from rows 4q..4q+3; afterwards 128-bit lane
  // L of u[4q + m] holds column 4L + m of rows 4q..4q+3.
  for (int q = 0; q < 4; ++q) {
    u[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  // Stage 3: gather lane L of u[m], u[4+m], u[8+m], u[12+m] into column 4L + m.
  for (int m = 0; m < 4; ++m) {
    const __m512i a0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88);  // lanes 0, 2 of each
    const __m512i a1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xdd);  // lanes 1, 3
    const __m512i b0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
    const __m512i b1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xdd);
    r[m] = _mm512_shuffle_i32x4(a0, b0, 0x88);       // lane 0
    r[4 + m] = _mm512_shuffle_i32x4(a1, b1, 0x88);   // lane 1
    r[8 + m] = _mm512_shuffle_i32x4(a0, b0, 0xdd);   // lane 2
    r[12 + m] = _mm512_shuffle_i32x4(a1, b1, 0xdd);  // lane 3
  }
}

template <DType S, DType D>
void pack_panel_t(const PanelPack& pp) {
  const int64_t steps = pack_steps(pp);
  char* out = static_cast<char*>(pp.out);
  constexpr int64_t kRowBytes = kPanel * 4;  // one panel row: 64 words
  // Source bytes of one row per 16-step block: 32 (bf16/f16 -> f32) to 128 (f32 -> bf16).
  constexpr int64_t kBlockBytes = 16 * (D == DType::BF16 ? 2 : 1) * (S == DType::F32 ? 4 : 2);
  __m512i r[16];
  for (int64_t s0 = 0; s0 < steps; s0 += 16) {
    const int ns = static_cast<int>(std::min<int64_t>(16, steps - s0));
    const int64_t ahead = (s0 / 16 + kPrefetchBlocks) * kBlockBytes;
    for (int jb = 0; jb < kPanel; jb += 16) {
      for (int i = 0; i < 16; ++i) {
        const char* row = static_cast<const char*>(pp.rows[jb + i]);
        if (!row) {
          r[i] = _mm512_setzero_si512();
          continue;
        }
        for (int64_t b = 0; b < kBlockBytes; b += 64) _mm_prefetch(row + ahead + b, _MM_HINT_T1);
        r[i] = load_words<S, D>(row, s0, pp.k);
      }
      transpose16(r);
      char* o = out + s0 * kRowBytes + jb * 4;
      for (int s = 0; s < ns; ++s) _mm512_stream_si512(reinterpret_cast<__m512i*>(o + s * kRowBytes), r[s]);
    }
  }
}

}  // namespace

void pack_panel_avx512(const PanelPack& pp) {
  const bool bf = pp.dst == DType::BF16;
  switch (pp.src) {
    case DType::F32: return bf ? pack_panel_t<DType::F32, DType::BF16>(pp) : pack_panel_t<DType::F32, DType::F32>(pp);
    case DType::BF16:
      return bf ? pack_panel_t<DType::BF16, DType::BF16>(pp) : pack_panel_t<DType::BF16, DType::F32>(pp);
    case DType::F16: return bf ? pack_panel_t<DType::F16, DType::BF16>(pp) : pack_panel_t<DType::F16, DType::F32>(pp);
    default: break;  // pack.cpp checked the dtype
  }
}

void pack_fence_avx512() { _mm_sfence(); }

}  // namespace moe::gg
