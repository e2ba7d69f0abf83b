// AVX2 panel packer (compiled with -mavx2 -mfma -mf16c; called only when active_isa() ==
// Avx2). Same words as pack_panel_portable (pack.cpp), bit for bit.
//
// A panel is built in tiles of 8 columns x 8 steps: 8 ymm, one per source row, each
// holding that row's 8 packed words of the tile, go through an 8x8 32-bit transpose and
// come out as 8 panel-row pieces of 32 bytes. Two column tiles are done together so each
// panel row gets a whole 64-byte line at once, written with a streaming store (the panel
// is not read again during loading, and a whole-line streaming store skips the read for
// ownership: on the AVX-512 packer this measured 4.8 vs 2.8 GB/s).
// Only whole 8-step blocks inside every row run here: the steps of a row's last partial
// block (odd K, K not a multiple of 8 or 16) go to the portable routine, so no load
// reads past the end of a row (the last row of an mmapped file stays safe). f16 sources
// run portable entirely (no checkpoint family we load stores f16 experts).
#include <immintrin.h>

#include <algorithm>

#include "kernels/grouped_gemm_avx2_common.h"
#include "kernels/pack_impl.h"

namespace moe::gg {
namespace {

// 16 bf16 with every NaN made quiet (bit 6 set), as f32_to_bf16 does.
inline __m256i quiet_bf16(__m256i h) {
  const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7f80));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x40)));
}

// The 8 packed words of steps [s0, s0 + 8) of one source row (all inside the row).
template <DType S, DType D>
inline __m256i load_words(const char* row, int64_t s0) {
  if constexpr (D == DType::BF16 && S == DType::BF16) {
    return quiet_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 4 * s0)));
  } else if constexpr (D == DType::BF16) {  // f32 -> bf16 pairs: the high halves of 16 rounded f32
    const __m256i a = round_to_bf16_hi(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 8 * s0)));
    const __m256i b = round_to_bf16_hi(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 8 * s0 + 32)));
    // packus of the high halves (shifted down) interleaves the 128-bit lanes; permute back.
    const __m256i p = _mm256_packus_epi32(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16));
    return _mm256_permute4x64_epi64(p, 0xd8);
  } else if constexpr (S == DType::F32) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 4 * s0));
  } else {  // bf16 -> f32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * s0));
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
  }
}

// In-register transpose of an 8x8 matrix of 32-bit words: r[i] lane c -> r[c] lane i.
inline void transpose8(__m256i (&r)[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int q = 0; q < 2; ++q) {
    u[4 * q + 0] = _mm256_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm256_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm256_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm256_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  // 128-bit lane L of u[m] holds column 4L + m of rows 0-3, u[4 + m] of rows 4-7.
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
  }
}

// Source bytes of one row per 8-step block, and the prefetch distance: as the AVX-512
// packer (measured there: a panel reads 64 rows side by side, more streams than the
// hardware prefetchers follow, and an L2 prefetch 4 blocks ahead doubled the speed).
template <DType S, DType D>
constexpr int64_t kBlockBytes = 8 * (D == DType::BF16 ? 2 : 1) * (S == DType::F32 ? 4 : 2);
constexpr int64_t kPrefetchBlocks = 8;

template <DType S, DType D>
void pack_panel_t(const PanelPack& pp) {
  const int64_t steps = pack_steps(pp);
  // Steps whose source elements all exist in the row: whole 8-step blocks only.
  const int64_t full = (D == DType::BF16 ? pp.k / 2 : pp.k) / 8 * 8;
  char* out = static_cast<char*>(pp.out);
  constexpr int64_t kRowBytes = kPanel * 4;
  for (int64_t s0 = 0; s0 < full; s0 += 8) {
    const int64_t ahead = (s0 / 8 + kPrefetchBlocks) * kBlockBytes<S, D>;
    for (int jb = 0; jb < kPanel; jb += 16) {
      __m256i r[2][8];
      for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < 8; ++i) {
          const char* row = static_cast<const char*>(pp.rows[jb + 8 * h + i]);
          if (!row) {
            r[h][i] = _mm256_setzero_si256();
            continue;
          }
          for (int64_t b = 0; b < kBlockBytes<S, D>; b += 64) _mm_prefetch(row + ahead + b, _MM_HINT_T1);
          r[h][i] = load_words<S, D>(row, s0);
        }
        transpose8(r[h]);
      }
      char* o = out + s0 * kRowBytes + jb * 4;
      for (int s = 0; s < 8; ++s) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(o + s * kRowBytes), r[0][s]);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(o + s * kRowBytes + 32), r[1][s]);
      }
    }
  }
  if (full < steps) pack_panel_portable_steps(pp, full, steps);
}

}  // namespace

void pack_panel_avx2(const PanelPack& pp) {
  const bool bf = pp.dst == DType::BF16;
  switch (pp.src) {
    case DType::F32: return bf ? pack_panel_t<DType::F32, DType::BF16>(pp) : pack_panel_t<DType::F32, DType::F32>(pp);
    case DType::BF16:
      return bf ? pack_panel_t<DType::BF16, DType::BF16>(pp) : pack_panel_t<DType::BF16, DType::F32>(pp);
    default: return pack_panel_portable(pp);
  }
}

void pack_fence_avx2() { _mm_sfence(); }

}  // namespace moe::gg
