// W4A8 task runner on AVX512-VNNI (vpdpbusd). Layout: grouped_gemm_int4_impl.h;
// contract: grouped_gemm_int4.h.
//
// vpdpbusd multiplies the UNSIGNED bytes of its first source by the SIGNED bytes of its
// second and adds each group of 4 products into an int32 lane. The int4 codes u are
// unsigned (0..15) and the activations signed int8, which is exactly that order: no
// compensation term (the int8 kernel needs one because both of its operands are signed).
// One 64-byte load of a panel octet is 16 columns x 8 k: `and 0x0f` gives the k quad
// 8o..8o+3 of each column and `srli 4; and 0x0f` the quad 8o+4..8o+7, each the [column][4 k]
// order vpdpbusd reduces; the row's 4 activation bytes of that quad are broadcast.
// Per group of at most 128 k: |sum u * a| <= 128 * 15 * 128 = 245760 and |z * sum(a)| the
// same, so the int32 difference is exact and below 2^24, hence exact as a float too. The
// float steps are the portable runner's (acc + (float)isum * scale: a multiply, then an
// add, no FMA; the project builds with -ffp-contract=off), so every ISA gives the same bits.
//
// Blocking: up to kMaxRows = 4 rows x 64 columns = 16 zmm int32 accumulators, named locals (with
// an array GCC 12 keeps them in memory: see grouped_gemm_int8_avx512.cpp). At 6 rows (24
// accumulators) GCC 12 spilled accumulators to the stack inside the k loop: the MoE layer
// bench at T = 512 (qwen3-30b-a3b shape, 2 threads, Zen 4) ran 88-90 ms there, 78-80 at 4. A k step does
// the low quads of the 4 column blocks, then the high quads, reloading the 256 bytes of
// the octet from L1 for the second half, so the accumulators, 4 decoded blocks, the nibble
// mask and one broadcast fit the 32 zmm registers. At a group's end the int32 sums become
// f32 (acc[row][64] in L1) and are reset. Decode (one row block) prefetches the weight
// stream 4 KiB ahead into L2 (T1), as the AVX2 and int8 kernels do. The epilogue (the
// activation) runs in zmm too.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/grouped_gemm_avx2_common.h"
#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_int4_avx512_common.h"
#include "kernels/grouped_gemm_int4_impl.h"

namespace moe::gg {
namespace {

// kPrefetchBytes (4 KiB): grouped_gemm_avx512_common.h.

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Columns 16q..16q+15 of group G's super-block value (sb_product16, as i4_expand_panel).
inline __m512 sb_value(const uint16_t* h, const int8_t* q8, const uint8_t* u8, int64_t G, int64_t gps, int q) {
  const int64_t g0 = G * kPanel + 16 * q;
  return sb_product16(h + (G / gps) * kPanel + 16 * q, q8 ? q8 + g0 : nullptr, u8 ? u8 + g0 : nullptr);
}

// One k quad (low or high nibbles, `SHIFT`) of the octet at bp into every row's accumulators.
#define MOE_I4_DECODE(SHIFT)                                                                                     \
  const __m512i w0 = _mm512_and_si512(_mm512_srli_epi16(_mm512_load_si512(bp), SHIFT), m4);                      \
  const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(_mm512_load_si512(bp + 64), SHIFT), m4);                 \
  const __m512i w2 = _mm512_and_si512(_mm512_srli_epi16(_mm512_load_si512(bp + 128), SHIFT), m4);                \
  const __m512i w3 = _mm512_and_si512(_mm512_srli_epi16(_mm512_load_si512(bp + 192), SHIFT), m4);
#define MOE_I4_ROW(R, QUAD)                                                                                      \
  if constexpr (MR > R) {                                                                                        \
    const __m512i av = _mm512_set1_epi32(load_i32(a[R] + 8 * o + (QUAD)));                                      \
    c##R##0 = _mm512_dpbusd_epi32(c##R##0, w0, av);                                                              \
    c##R##1 = _mm512_dpbusd_epi32(c##R##1, w1, av);                                                              \
    c##R##2 = _mm512_dpbusd_epi32(c##R##2, w2, av);                                                              \
    c##R##3 = _mm512_dpbusd_epi32(c##R##3, w3, av);                                                              \
  }
// The 8-bit layout's quad o of every row: its 4 activation bytes a[R][4o..4o+3] broadcast.
#define MOE_G8_ROW(R)                                                                                            \
  if constexpr (MR > R) {                                                                                        \
    const __m512i av = _mm512_set1_epi32(load_i32(a[R] + 4 * o));                                                \
    c##R##0 = _mm512_dpbusd_epi32(c##R##0, w0, av);                                                              \
    c##R##1 = _mm512_dpbusd_epi32(c##R##1, w1, av);                                                              \
    c##R##2 = _mm512_dpbusd_epi32(c##R##2, w2, av);                                                              \
    c##R##3 = _mm512_dpbusd_epi32(c##R##3, w3, av);                                                              \
  }
// acc[R] (f32, 64 columns) += (float)(c - z * sum(a over the group)) * scale, then c = 0.
// z * sum(a) by vpmaddwd (one uop; vpmulld is two): z in the low int16 of each lane, the
// sum in the low int16 of the broadcast, zeros above, so each lane is z * sum + 0 * 0.
// The sum fits int16: |sum(a)| <= 128 * 127 = 16256 over a group of at most 128.
#define MOE_I4_FLUSH_Q(R, Q)                                                                                     \
  {                                                                                                              \
    const __m512i isum = _mm512_sub_epi32(c##R##Q, _mm512_madd_epi16(z##Q, _mm512_set1_epi32(sa[R * ng + G] & 0xffff))); \
    float* dst = acc[R] + 16 * (Q);                                                                              \
    _mm512_store_ps(dst, _mm512_add_ps(_mm512_load_ps(dst), _mm512_mul_ps(_mm512_cvtepi32_ps(isum), s##Q)));     \
    c##R##Q = _mm512_setzero_si512();                                                                            \
  }
#define MOE_I4_FLUSH(R)                                                                                          \
  if constexpr (MR > R) {                                                                                        \
    MOE_I4_FLUSH_Q(R, 0) MOE_I4_FLUSH_Q(R, 1) MOE_I4_FLUSH_Q(R, 2) MOE_I4_FLUSH_Q(R, 3)                          \
  }
// The offset form: acc[R] += (float)c * scale - (float)sum(a) * offset, then c = 0.
#define MOE_I4_FLUSH_OFF_Q(R, Q)                                                                                 \
  {                                                                                                              \
    const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(c##R##Q), s##Q);                                          \
    const __m512 q = _mm512_mul_ps(_mm512_set1_ps(static_cast<float>(sa[R * ng + G])), f##Q);                   \
    float* dst = acc[R] + 16 * (Q);                                                                              \
    _mm512_store_ps(dst, _mm512_add_ps(_mm512_load_ps(dst), _mm512_sub_ps(p, q)));                               \
    c##R##Q = _mm512_setzero_si512();                                                                            \
  }
#define MOE_I4_FLUSH_OFF(R)                                                                                      \
  if constexpr (MR > R) {                                                                                        \
    MOE_I4_FLUSH_OFF_Q(R, 0) MOE_I4_FLUSH_OFF_Q(R, 1) MOE_I4_FLUSH_OFF_Q(R, 2) MOE_I4_FLUSH_OFF_Q(R, 3)          \
  }
// Group G's scales s0..s3 (and, offset form, offsets f0..f3 inside MOE_I4_FLUSH_GROUP):
// from ws / wo, or formed from the super-block sources sb (decode, not expanded).
#define MOE_I4_LOAD_SCALES                                                                                       \
  __m512 s0, s1, s2, s3;                                                                                         \
  if (ws) {                                                                                                      \
    const float* sg = ws + G * kPanel;                                                                           \
    s0 = _mm512_loadu_ps(sg), s1 = _mm512_loadu_ps(sg + 16), s2 = _mm512_loadu_ps(sg + 32),                     \
    s3 = _mm512_loadu_ps(sg + 48);                                                                               \
  } else {                                                                                                       \
    s0 = sb_value(sb->d, sb->sc, nullptr, G, sb->gps, 0), s1 = sb_value(sb->d, sb->sc, nullptr, G, sb->gps, 1),  \
    s2 = sb_value(sb->d, sb->sc, nullptr, G, sb->gps, 2), s3 = sb_value(sb->d, sb->sc, nullptr, G, sb->gps, 3);  \
  }
// Both forms, at the end of group G (the scales s0..s3 loaded; wz, wo or sb->m set).
#define MOE_I4_FLUSH_GROUP                                                                                       \
  if (wo || (sb && sb->m)) {                                                                                     \
    __m512 f0, f1, f2, f3;                                                                                       \
    if (wo) {                                                                                                    \
      const float* og = wo + G * kPanel;                                                                         \
      f0 = _mm512_loadu_ps(og), f1 = _mm512_loadu_ps(og + 16), f2 = _mm512_loadu_ps(og + 32),                   \
      f3 = _mm512_loadu_ps(og + 48);                                                                             \
    } else {                                                                                                     \
      f0 = sb_value(sb->m, nullptr, sb->mn, G, sb->gps, 0), f1 = sb_value(sb->m, nullptr, sb->mn, G, sb->gps, 1), \
      f2 = sb_value(sb->m, nullptr, sb->mn, G, sb->gps, 2), f3 = sb_value(sb->m, nullptr, sb->mn, G, sb->gps, 3); \
    }                                                                                                            \
    MOE_I4_FLUSH_OFF(0) MOE_I4_FLUSH_OFF(1) MOE_I4_FLUSH_OFF(2) MOE_I4_FLUSH_OFF(3)                              \
  } else {                                                                                                       \
    const uint8_t* zg = wz + G * kPanel;                                                                         \
    const __m512i z0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zg)));              \
    const __m512i z1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zg + 16)));         \
    const __m512i z2 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zg + 32)));         \
    const __m512i z3 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zg + 48)));         \
    MOE_I4_FLUSH(0) MOE_I4_FLUSH(1) MOE_I4_FLUSH(2) MOE_I4_FLUSH(3)                                              \
  }

struct Avx512Vnni {
  static constexpr int kMaxRows = 4;  // the MOE_I4_ROW / MOE_I4_FLUSH rows 0..3 below
  static constexpr bool kFormsSbScales = true;  // panel_block takes the SbSrc (MOE_I4_LOAD_SCALES)

static void group_sums(const int8_t* a, int64_t K, int64_t group, int64_t n_groups, int32_t* sa) {
  i4_group_sums_avx2(a, K, group, n_groups, sa, i4_group_sums);
}

static void epilogue_row(const Job& j, float* acc, float a_scale, char* crow, int64_t col0, int nv) {
  i4_epilogue_row_avx512(j, acc, a_scale, crow, col0, nv);
}

// acc[r][0..64) = the panel's dequantised sums for rows a[0..MR) (acc zeroed by the caller).
template <int MR, bool kPrefetch>
static void panel_block(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                        const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb = nullptr) {
  const int64_t n_oct = i4_octets(j.k), ng = j.i4_n_groups, go = j.i4_group / 8;
  const __m512i m4 = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
  __m512i c00 = zero, c01 = zero, c02 = zero, c03 = zero, c10 = zero, c11 = zero, c12 = zero, c13 = zero;
  __m512i c20 = zero, c21 = zero, c22 = zero, c23 = zero, c30 = zero, c31 = zero, c32 = zero, c33 = zero;
  for (int64_t G = 0; G < ng; ++G) {
    const int64_t o1 = std::min(n_oct, (G + 1) * go);
    for (int64_t o = G * go; o < o1; ++o) {
      const uint8_t* bp = panel + o * kI4OctetBytes;
      if constexpr (kPrefetch) {
        const char* pf = reinterpret_cast<const char*>(bp) + kPrefetchBytes;
        _mm_prefetch(pf, _MM_HINT_T1);
        _mm_prefetch(pf + 64, _MM_HINT_T1);
        _mm_prefetch(pf + 128, _MM_HINT_T1);
        _mm_prefetch(pf + 192, _MM_HINT_T1);
      }
      {
        MOE_I4_DECODE(0)
        MOE_I4_ROW(0, 0) MOE_I4_ROW(1, 0) MOE_I4_ROW(2, 0) MOE_I4_ROW(3, 0)
      }
      {
        MOE_I4_DECODE(4)
        MOE_I4_ROW(0, 4) MOE_I4_ROW(1, 4) MOE_I4_ROW(2, 4) MOE_I4_ROW(3, 4)
      }
    }
    MOE_I4_LOAD_SCALES
    MOE_I4_FLUSH_GROUP
  }
}

};

// Byte codes: 8-bit codes, and 6-bit codes rebuilt into the 8-bit layout. K::codes gives
// quad o's four 64-byte blocks (16 columns x 4 k each, the [column][4 k] order vpdpbusd
// reduces) and K::prefetch prefetches quad o. |dot| per group of at most 128 k:
// 128 * 255 * 128 = 4177920 < 2^24, and |z * sum(a)| the same, so the int32 difference
// and its float are exact as in the 4-bit runner.
template <class K>
struct Avx512Bytes : Avx512Vnni {
  template <int MR, bool kPrefetch>
  static void panel_block(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                          const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel],
                          const SbSrc* sb = nullptr) {
    const int64_t n_q = g8_quads(j.k), ng = j.i4_n_groups, gq = j.i4_group / 4;
    const __m512i zero = _mm512_setzero_si512();
    __m512i c00 = zero, c01 = zero, c02 = zero, c03 = zero, c10 = zero, c11 = zero, c12 = zero, c13 = zero;
    __m512i c20 = zero, c21 = zero, c22 = zero, c23 = zero, c30 = zero, c31 = zero, c32 = zero, c33 = zero;
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t q1 = std::min(n_q, (G + 1) * gq);
      for (int64_t o = G * gq; o < q1; ++o) {
        if constexpr (kPrefetch) K::prefetch(panel, o);
        __m512i w0, w1, w2, w3;
        K::codes(panel, o, w0, w1, w2, w3);
        MOE_G8_ROW(0) MOE_G8_ROW(1) MOE_G8_ROW(2) MOE_G8_ROW(3)
      }
      MOE_I4_LOAD_SCALES
      MOE_I4_FLUSH_GROUP
    }
  }
};

inline void prefetch_quad(const uint8_t* quad, int64_t bytes) {
  const char* pf = reinterpret_cast<const char*>(quad) + kPrefetchBytes;
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T1);
}

// 8-bit codes (grouped_gemm_int4_impl.h's quad layout): already in that order, no decode.
struct G8Codes {
  static void codes(const uint8_t* panel, int64_t o, __m512i& w0, __m512i& w1, __m512i& w2, __m512i& w3) {
    const uint8_t* bp = panel + o * kI4OctetBytes;
    w0 = _mm512_load_si512(bp);
    w1 = _mm512_load_si512(bp + 64);
    w2 = _mm512_load_si512(bp + 128);
    w3 = _mm512_load_si512(bp + 192);
  }
  static void prefetch(const uint8_t* panel, int64_t o) { prefetch_quad(panel + o * kI4OctetBytes, kI4OctetBytes); }
};

// 6-bit codes (the 192-byte quads), each 16-column chunk rebuilt by g6_chunk_avx512.
struct G6Codes {
  static __m512i chunk(const uint8_t* quad, int q) { return g6_chunk_avx512(quad, q); }
  static void codes(const uint8_t* panel, int64_t o, __m512i& w0, __m512i& w1, __m512i& w2, __m512i& w3) {
    const uint8_t* quad = panel + o * kG6QuadBytes;
    w0 = chunk(quad, 0);
    w1 = chunk(quad, 1);
    w2 = chunk(quad, 2);
    w3 = chunk(quad, 3);
  }
  static void prefetch(const uint8_t* panel, int64_t o) { prefetch_quad(panel + o * kG6QuadBytes, kG6QuadBytes); }
};
#undef MOE_I4_DECODE
#undef MOE_I4_ROW
#undef MOE_G8_ROW
#undef MOE_I4_FLUSH_Q
#undef MOE_I4_FLUSH
#undef MOE_I4_FLUSH_OFF_Q
#undef MOE_I4_FLUSH_OFF
#undef MOE_I4_FLUSH_GROUP
#undef MOE_I4_LOAD_SCALES

}  // namespace

void run_task_avx512_vnni_i4(const Job& j, const Task& t) { i4_run_task<Avx512Vnni>(j, t); }
void run_task_avx512_vnni_g8(const Job& j, const Task& t) { i4_run_task<Avx512Bytes<G8Codes>>(j, t); }
void run_task_avx512_vnni_g6(const Job& j, const Task& t) { i4_run_task<Avx512Bytes<G6Codes>>(j, t); }

}  // namespace moe::gg
