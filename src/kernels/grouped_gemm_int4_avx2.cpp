// W4A8 task runner, AVX2 (vpmaddubsw + vpmaddwd); AVX512-VNNI machines run
// grouped_gemm_int4_avx512.cpp instead. Layout: grouped_gemm_int4_impl.h; contract:
// grouped_gemm_int4.h.
//
// Per 32-byte load (8 columns x 8 k): `and 0x0f` and `srli 4; and 0x0f` give the two k
// quads as unsigned codes u in [0, 15]; vpmaddubsw(u, a) multiplies them with the row's
// int8 activations a (4 bytes broadcast per quad) and adds adjacent pairs into int16;
// vpaddw sums up to 4 octets (32 k) in int16; vpmaddwd with ones adds the int16 pairs
// into one int32 per column. The zero point is applied once per group as z * sum(a).
// Why nothing saturates or wraps: |a| <= 127 (Q8 rows clamp to [-127, 127]; even -128
// would do), u <= 15, so a vpmaddubsw pair sum is at most 2 * 15 * 128 = 3840 and the
// int16 sum of 8 of them (4 octets x 2 quads) at most 30720 < 32767; vpmaddwd then
// adds two such into int32 exactly. Per group of at most 128 k: |dot| <= 128 * 15 * 128
// = 245760 and |z * sum(a)| <= 15 * 128 * 128 = 245760, so the int32 difference is exact
// and, being below 2^24, so is its conversion to float. The float steps are those of
// the portable runner (multiply, then add; no FMA), so the bits agree.
//
// Decode (<= kDecodeMaxRows rows): all rows are one register block, so each weight byte
// is loaded once per task, with the stream prefetched 4 KiB ahead into L2 (T1, as the
// int8 VNNI kernel, whose comment has the measurement). Prefill: blocks of up to 4 rows per
// pass over the panel (which stays in L1/L2 between passes).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/grouped_gemm_avx2_common.h"
#include "kernels/grouped_gemm_int4_impl.h"

namespace moe::gg {
namespace {

constexpr int kPrefetchBytes = 4096;

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

struct Avx2 {
  static constexpr int kMaxRows = 4;

static void group_sums(const int8_t* a, int64_t K, int64_t group, int64_t n_groups, int32_t* sa) {
  i4_group_sums_avx2(a, K, group, n_groups, sa, i4_group_sums);
}

// i4_epilogue_row in ymm: t = acc * a_scale in place, then avx2_epilogue_row (the same
// operations as the scalar epilogue, lane by lane).
static void epilogue_row(const Job& j, float* acc, float a_scale, char* crow, int64_t col0, int nv) {
  const __m256 vas = _mm256_set1_ps(a_scale);
  for (int c = 0; c < kPanel; c += 8) _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(acc + c), vas));
  avx2_epilogue_row(j, acc, crow, col0, nv);
}

// acc[r][0..64) += the groups' dequantised sums for rows a[0..MR) x one panel.
template <int MR, bool kPrefetch>
static void panel_block(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                        const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel]) {
  const int64_t n_oct = i4_octets(j.k), ng = j.i4_n_groups, go = j.i4_group / 8;
  const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int64_t G = 0; G < ng; ++G) {
    const int64_t o0 = G * go, o1 = std::min(n_oct, o0 + go);
    for (int cb = 0; cb < kPanel / 8; ++cb) {
      __m256i a32[MR];
      for (int r = 0; r < MR; ++r) a32[r] = _mm256_setzero_si256();
      for (int64_t o = o0; o < o1; o += 4) {
        const int64_t oe = std::min(o1, o + 4);
        __m256i a16[MR];
        for (int r = 0; r < MR; ++r) a16[r] = _mm256_setzero_si256();
        for (int64_t oo = o; oo < oe; ++oo) {
          const uint8_t* bp = panel + oo * kI4OctetBytes;
          if constexpr (kPrefetch) {
            if (cb == 0) {
              const char* pf = reinterpret_cast<const char*>(bp) + kPrefetchBytes;
              _mm_prefetch(pf, _MM_HINT_T1);
              _mm_prefetch(pf + 64, _MM_HINT_T1);
              _mm_prefetch(pf + 128, _MM_HINT_T1);
              _mm_prefetch(pf + 192, _MM_HINT_T1);
            }
          }
          const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + cb * 32));
          const __m256i lo = _mm256_and_si256(w, m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
          for (int r = 0; r < MR; ++r) {
            const int8_t* ar = a[r] + 8 * oo;
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(ar)),
                                               _mm256_maddubs_epi16(hi, bcast4(ar + 4)));
            a16[r] = _mm256_add_epi16(a16[r], p);
          }
        }
        for (int r = 0; r < MR; ++r) a32[r] = _mm256_add_epi32(a32[r], _mm256_madd_epi16(a16[r], ones));
      }
      flush<MR>(a32, G * kPanel + cb * 8, ws, wz, wo, sa + G, ng, acc, cb * 8);
    }
  }
}

// acc[r][c0..c0+8) += the group's dequantised sums of dot[r] (8 columns), in the order of
// grouped_gemm_int4_impl.h: zero points (float)(dot - z * sa) * s, or offsets
// (float)dot * s - (float)sa * offset. at: the group's entry of these 8 columns in
// ws / wz / wo; sa[r * ng]: row r's activation sum of the group.
template <int MR>
static void flush(const __m256i* dot, int64_t at, const float* ws, const uint8_t* wz, const float* wo,
                  const int32_t* sa, int64_t ng, float (*acc)[kPanel], int c0) {
  const __m256 s = _mm256_loadu_ps(ws + at);
  if (wo) {
    const __m256 f = _mm256_loadu_ps(wo + at);
    for (int r = 0; r < MR; ++r) {
      const __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r]), s);
      const __m256 q = _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(sa[r * ng])), f);
      float* dst = acc[r] + c0;
      _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_sub_ps(p, q)));
    }
    return;
  }
  const __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wz + at)));
  for (int r = 0; r < MR; ++r) {
    const __m256i isum = _mm256_sub_epi32(dot[r], _mm256_mullo_epi32(z, _mm256_set1_epi32(sa[r * ng])));
    float* dst = acc[r] + c0;
    _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_mul_ps(_mm256_cvtepi32_ps(isum), s)));
  }
}

};

// 8-bit codes (the quad layout of grouped_gemm_int4_impl.h). vpmaddubsw would saturate
// (a code pair times activations reaches 2 * 255 * 127 > 32767), so the codes are widened
// to int16 (vpmovzxbw) and multiplied with the row's 4 activations, widened and
// broadcast, by vpmaddwd: exact int32 pair sums, two per column per quad, kept apart
// (columns 0-3 and 4-7 of the ymm) until the group's end, where vphaddd adds each
// column's two and vpermq puts the 8 columns in order. K gives column block cb's 32 code
// bytes of quad o (8 columns x 4 k, the quad layout's order) and prefetches quad o.
template <class K>
struct Avx2Bytes : Avx2 {
  template <int MR, bool kPrefetch>
  static void panel_block(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                          const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel]) {
    const int64_t n_q = g8_quads(j.k), ng = j.i4_n_groups, gq = j.i4_group / 4;
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t q0 = G * gq, q1 = std::min(n_q, q0 + gq);
      for (int cb = 0; cb < kPanel / 8; ++cb) {
        __m256i lo[MR], hi[MR];
        for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
        for (int64_t o = q0; o < q1; ++o) {
          if constexpr (kPrefetch) {
            if (cb == 0) K::prefetch(panel, o);
          }
          const __m256i w = K::codes(panel, o, cb);
          const __m256i wl = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(w));
          const __m256i wh = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(w, 1));
          for (int r = 0; r < MR; ++r) {
            int32_t q;
            std::memcpy(&q, a[r] + 4 * o, 4);
            const __m256i av = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(q)));
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(wl, av));
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(wh, av));
          }
        }
        __m256i dot[MR];
        for (int r = 0; r < MR; ++r) dot[r] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0xd8);
        flush<MR>(dot, G * kPanel + cb * 8, ws, wz, wo, sa + G, ng, acc, cb * 8);
      }
    }
  }
};

struct G8Codes {
  static __m256i codes(const uint8_t* panel, int64_t o, int cb) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + o * kI4OctetBytes + cb * 32));
  }
  static void prefetch(const uint8_t* panel, int64_t o) {
    const char* pf = reinterpret_cast<const char*>(panel + o * kI4OctetBytes) + kPrefetchBytes;
    for (int b = 0; b < 256; b += 64) _mm_prefetch(pf + b, _MM_HINT_T1);
  }
};

// 6-bit codes (the 192-byte quads): block cb is half of chunk cb / 2, its low nibbles
// (cb even: columns 0-7) or high ones (odd: 8-15), or'ed with the top bits of its two
// 4-column lanes (the chunk's 16 top-bit bytes in both 128-bit lanes, shifted right by
// 2s for column group s).
struct G6Codes {
  static __m256i codes(const uint8_t* panel, int64_t o, int cb) {
    const uint8_t* quad = panel + o * kG6QuadBytes;
    const int q = cb / 2;
    const __m256i nb = _mm256_load_si256(reinterpret_cast<const __m256i*>(quad + 32 * q));
    const __m256i nib = _mm256_and_si256(cb % 2 ? _mm256_srli_epi16(nb, 4) : nb, _mm256_set1_epi8(0x0f));
    const __m256i top =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(quad + 128 + 16 * q)));
    const __m256i sh = cb % 2 ? _mm256_set_epi32(6, 6, 6, 6, 4, 4, 4, 4) : _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0);
    return _mm256_or_si256(
        nib, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(top, sh), _mm256_set1_epi8(0x03)), 4));
  }
  static void prefetch(const uint8_t* panel, int64_t o) {
    const char* pf = reinterpret_cast<const char*>(panel + o * kG6QuadBytes) + kPrefetchBytes;
    for (int b = 0; b < kG6QuadBytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T1);
  }
};

}  // namespace

void run_task_avx2_i4(const Job& j, const Task& t) { i4_run_task<Avx2>(j, t); }
void run_task_avx2_g8(const Job& j, const Task& t) { i4_run_task<Avx2Bytes<G8Codes>>(j, t); }
void run_task_avx2_g6(const Job& j, const Task& t) { i4_run_task<Avx2Bytes<G6Codes>>(j, t); }

}  // namespace moe::gg
