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
// int8 VNNI kernel, whose comment has the measurement); one row (batch 1) reads each
// panel in memory order (one_row_g32, one_row_wide, and the 8- and 6-bit runners'
// one_row). Prefill: blocks of up to kMaxRows rows (4; 8 for 8-bit codes) per pass over
// the panel (which stays in L1/L2 between passes).
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
  // Decode forms super-block scales (K-quants, Q4_0's f16 d) in the flush from the
  // file's bytes (sb8), where expanding every panel's [group][64] f32 scales first wrote
  // and reread 16 KiB per 64 KiB panel of 2048-k codes.
  static constexpr bool kFormsSbScales = true;

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
                        const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb = nullptr) {
  if constexpr (MR == 1 && kPrefetch) {
    if (j.i4_group <= 32) return one_row_g32(j, panel, ws, wz, wo, a[0], sa, acc, sb);
    return one_row_wide(j, panel, ws, wz, wo, a[0], sa, acc, sb);
  } else {
    if (!kPrefetch && ws && j.i4_group == 32 && j.k % 32 == 0) return panel_block_g32<MR>(j, panel, ws, wz, wo, a, sa, acc);
    blocks<MR, kPrefetch>(j, panel, ws, wz, wo, a, sa, acc, sb);
  }
}

// Row blocks (prefill, batched decode): per group and column block, the group's octets.
template <int MR, bool kPrefetch>
static void blocks(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                   const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
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
      flush<MR>(a32, G, cb * 8, ws, wz, wo, sb, sa + G, ng, acc);
    }
  }
}

// One column block's 32 code bytes of an octet (8 columns x 8 k) times the row's two
// activation quads al (k 0-3) and ah (k 4-7): the int16 pair sums, both nibbles added.
static __m256i octet_products(const uint8_t* p, __m256i al, __m256i ah) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), w = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, al), _mm256_maddubs_epi16(hi, ah));
}

// Batch-1 decode with groups of at most 32 k (at most 4 octets: Q4_0, Q4_1, Q4_K, int4
// g32): the panel in memory order, each octet's 8 column blocks into 8 int16 accumulators
// (the group's sums, at most 30720: the bound above), where the loop above walks a
// group's octets once per column block, 32 bytes at a 256-byte stride. The same int16
// sums, widened and flushed the same way: the same bits. Q4_0 decode at 512 on 2 threads
// of a Zen 3 went from 99.6-110.0 to 117.6-132.4 tokens/s (docs/PERF.md, fifteenth session).
static void one_row_g32(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                        const int8_t* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
  const int64_t n_oct = i4_octets(j.k), ng = j.i4_n_groups, go = j.i4_group / 8;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t G = 0; G < ng; ++G) {
    const int64_t o0 = G * go, o1 = std::min(n_oct, o0 + go);
    __m256i s[kPanel / 8];
    for (auto& v : s) v = _mm256_setzero_si256();
    for (int64_t o = o0; o < o1; ++o) {
      const uint8_t* bp = panel + o * kI4OctetBytes;
      const char* pf = reinterpret_cast<const char*>(bp) + kPrefetchBytes;
      for (int b = 0; b < kI4OctetBytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T1);
      const __m256i al = bcast4(a + 8 * o), ah = bcast4(a + 8 * o + 4);
      for (int cb = 0; cb < kPanel / 8; ++cb) s[cb] = _mm256_add_epi16(s[cb], octet_products(bp + cb * 32, al, ah));
    }
    for (int cb = 0; cb < kPanel / 8; ++cb) {
      const __m256i dot = _mm256_madd_epi16(s[cb], ones);
      flush<1>(&dot, G, cb * 8, ws, wz, wo, sb, sa + G, ng, acc);
    }
  }
}

// Batch-1 decode with groups of 64 or 128 k (GPTQ, AWQ, compressed-tensors): 8 int16 and
// 8 int32 accumulators do not fit the 16 ymm next to the codes, so each group takes two
// passes of 4 column blocks, each reading 128 contiguous bytes of every octet (the loop
// above read 32 at a 256-byte stride: `moe-ep bench --dtype int4 --int4-group 128
// --tokens 1` streamed at 0.45-0.53 of the probed bandwidth, g32 at 0.84). The int16
// sums of 4 octets, then int32, as above: the same bits.
static void one_row_wide(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                         const int8_t* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
  const int64_t n_oct = i4_octets(j.k), ng = j.i4_n_groups, go = j.i4_group / 8;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t G = 0; G < ng; ++G) {
    const int64_t o0 = G * go, o1 = std::min(n_oct, o0 + go);
    for (int half = 0; half < 2; ++half) {
      __m256i s32[4];
      for (auto& v : s32) v = _mm256_setzero_si256();
      for (int64_t o = o0; o < o1; o += 4) {
        const int64_t oe = std::min(o1, o + 4);
        __m256i s16[4];
        for (auto& v : s16) v = _mm256_setzero_si256();
        for (int64_t oo = o; oo < oe; ++oo) {
          const uint8_t* bp = panel + oo * kI4OctetBytes + 128 * half;
          if (half == 0) {
            const char* pf = reinterpret_cast<const char*>(bp) + kPrefetchBytes;
            for (int b = 0; b < kI4OctetBytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T1);
          }
          const __m256i al = bcast4(a + 8 * oo), ah = bcast4(a + 8 * oo + 4);
          for (int c = 0; c < 4; ++c) s16[c] = _mm256_add_epi16(s16[c], octet_products(bp + c * 32, al, ah));
        }
        for (int c = 0; c < 4; ++c) s32[c] = _mm256_add_epi32(s32[c], _mm256_madd_epi16(s16[c], ones));
      }
      for (int c = 0; c < 4; ++c) flush<1>(s32 + c, G, (4 * half + c) * 8, ws, wz, wo, sb, sa + G, ng, acc);
    }
  }
}

// Prefill (scales expanded into ws) with groups of 32 k (Q4_0, Q4_K, int4 g32) and K a
// multiple of 32, so every group is 4 whole octets: the same integer sums and float steps
// as the general loop above, with fewer instructions per multiply-add.
// - A group's int16 sums (8 vpmaddubsw pair sums, at most 30720: the bound above) go to
//   the flush with one vpmaddwd, no int32 stage.
// - Two column blocks go side by side: 8 int16 accumulators (4 rows x 16 columns) + 4
//   code registers + the mask fit the 16 ymm, and each code load and nibble split serves
//   4 rows.
// - Each row's activation quads are broadcast once per group into a buffer that the 4
//   column-block pairs read as vpmaddubsw's memory operand: vpbroadcastd takes a shuffle
//   port that the nibble shifts need too (llvm-mca -mcpu=znver3).
// `moe-ep bench --dtype int4 --tokens 512 --threads 1` on a Zen 3 core: 390 -> 308 ms a
// layer call, medians of 5 interleaved runs of the two builds (docs/PERF.md, twelfth session).
template <int MR>
static void panel_block_g32(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                            const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel]) {
  const int64_t ng = j.i4_n_groups;
  const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int64_t G = 0; G < ng; ++G) {
    const uint8_t* gp = panel + G * 4 * kI4OctetBytes;
    float saf[MR];  // the rows' activation sums of the group as floats (offset form)
    // The group's activations, each row's 4-byte quads broadcast once for all column
    // blocks (vpbroadcastd takes a shuffle port, which the code shifts also need; the
    // column loop reads these with plain loads).
    alignas(32) __m256i bb[MR][8];
    for (int r = 0; r < MR; ++r) {
      saf[r] = static_cast<float>(sa[r * ng + G]);
      for (int q = 0; q < 8; ++q) bb[r][q] = bcast4(a[r] + 32 * G + 4 * q);
    }
    const __m256i* bbp = &bb[0][0];
    asm("" : "+r"(bbp) : : "memory");
    for (int cb = 0; cb < kPanel / 8; cb += 2) {
      __m256i s0[MR], s1[MR];
      for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm256_setzero_si256();
      // Opaque to the optimiser: otherwise GCC hoists the loads out of the column loop
      // into registers and spills them.
      asm("" : "+r"(bbp));
#pragma GCC unroll 4
      for (int o = 0; o < 4; ++o) {
        const uint8_t* bp = gp + o * kI4OctetBytes + cb * 32;
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp));
        const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + 32));
        const __m256i l0 = _mm256_and_si256(w0, m4), h0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), m4);
        const __m256i l1 = _mm256_and_si256(w1, m4), h1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), m4);
        for (int r = 0; r < MR; ++r) {
          const __m256i b0 = _mm256_load_si256(bbp + 8 * r + 2 * o), b1 = _mm256_load_si256(bbp + 8 * r + 2 * o + 1);
          s0[r] = _mm256_add_epi16(s0[r], _mm256_add_epi16(_mm256_maddubs_epi16(l0, b0), _mm256_maddubs_epi16(h0, b1)));
          s1[r] = _mm256_add_epi16(s1[r], _mm256_add_epi16(_mm256_maddubs_epi16(l1, b0), _mm256_maddubs_epi16(h1, b1)));
          // Keeps each product in its accumulator: otherwise GCC reassociates a group's 16
          // products per row into a tree and spills them.
          asm("" : "+x"(s0[r]), "+x"(s1[r]));
        }
      }
      for (int r = 0; r < MR; ++r) {
        s0[r] = _mm256_madd_epi16(s0[r], ones);
        s1[r] = _mm256_madd_epi16(s1[r], ones);
      }
      flush16<MR>(s0, s1, G, cb * 8, ws, wz, wo, sa + G, saf, ng, acc);
    }
  }
}

// flush for 16 columns c0..c0+16 (dot0[r] the first 8, dot1[r] the next 8) with the
// scales in ws: flush's float steps per column, each row's activation sum broadcast once
// for both halves (saf[r]: row r's sum of group G as a float, for the offset form).
template <int MR>
static void flush16(const __m256i* dot0, const __m256i* dot1, int64_t G, int c0, const float* ws, const uint8_t* wz,
                    const float* wo, const int32_t* sa, const float* saf, int64_t ng, float (*acc)[kPanel]) {
  const int64_t at = G * kPanel + c0;
  const __m256 s0 = _mm256_loadu_ps(ws + at), s1 = _mm256_loadu_ps(ws + at + 8);
  if (wo) {
    const __m256 f0 = _mm256_loadu_ps(wo + at), f1 = _mm256_loadu_ps(wo + at + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 fa = _mm256_broadcast_ss(saf + r);
      float* dst = acc[r] + c0;
      const __m256 p0 = _mm256_mul_ps(_mm256_cvtepi32_ps(dot0[r]), s0), p1 = _mm256_mul_ps(_mm256_cvtepi32_ps(dot1[r]), s1);
      _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_sub_ps(p0, _mm256_mul_ps(fa, f0))));
      _mm256_storeu_ps(dst + 8, _mm256_add_ps(_mm256_loadu_ps(dst + 8), _mm256_sub_ps(p1, _mm256_mul_ps(fa, f1))));
    }
    return;
  }
  const __m256i z0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wz + at)));
  const __m256i z1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wz + at + 8)));
  for (int r = 0; r < MR; ++r) {
    const __m256i sr = _mm256_set1_epi32(sa[r * ng]);
    float* dst = acc[r] + c0;
    const __m256i i0 = _mm256_sub_epi32(dot0[r], _mm256_mullo_epi32(z0, sr));
    const __m256i i1 = _mm256_sub_epi32(dot1[r], _mm256_mullo_epi32(z1, sr));
    _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_mul_ps(_mm256_cvtepi32_ps(i0), s0)));
    _mm256_storeu_ps(dst + 8, _mm256_add_ps(_mm256_loadu_ps(dst + 8), _mm256_mul_ps(_mm256_cvtepi32_ps(i1), s1)));
  }
}

// 8 columns of a super-block value, as i4_expand_panel's AVX2 branch forms them: the f16
// h[hat..hat+8) widened, times the i8 q8 or u8 u8 factors [at..at+8) when given (both
// exact conversions, one rounding: the expanded scales' bits).
static __m256 sb8(const uint16_t* h, const int8_t* q8, const uint8_t* u8, int64_t hat, int64_t at) {
  const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + hat)));
  if (!q8 && !u8) return v;
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q8 ? static_cast<const void*>(q8 + at) : u8 + at));
  return _mm256_mul_ps(v, _mm256_cvtepi32_ps(q8 ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)));
}

// acc[r][c0..c0+8) += group G's dequantised sums of dot[r] (8 columns), in the order of
// grouped_gemm_int4_impl.h: zero points (float)(dot - z * sa) * s, or offsets
// (float)dot * s - (float)sa * offset. The group's scales (and offsets) of these columns
// come from ws (wo), or, both null, are formed from sb; sa[r * ng]: row r's activation
// sum of the group.
template <int MR>
static void flush(const __m256i* dot, int64_t G, int c0, const float* ws, const uint8_t* wz, const float* wo,
                  const SbSrc* sb, const int32_t* sa, int64_t ng, float (*acc)[kPanel]) {
  const int64_t at = G * kPanel + c0, hat = sb ? (G / sb->gps) * kPanel + c0 : 0;
  const __m256 s = ws ? _mm256_loadu_ps(ws + at) : sb8(sb->d, sb->sc, nullptr, hat, at);
  if (wo || (!ws && sb->m)) {
    const __m256 f = wo ? _mm256_loadu_ps(wo + at) : sb8(sb->m, nullptr, sb->mn, hat, at);
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

// 8-bit codes (the quad layout of grouped_gemm_int4_impl.h). vpmaddubsw of the unsigned
// codes would saturate (a code pair times activations reaches 2 * 255 * 127 > 32767), so
// both runners make the codes signed, w = u - 128 (u ^ 0x80), and multiply |w| (<= 128 as
// unsigned) by sign(a, w) (|a| <= 127: the Q8 rows' clamp): a pair sum is at most
// 2 * 128 * 127 = 32512, so nothing saturates, and vpmaddwd with ones adds the pairs into
// int32 exactly. sum w * a + 128 * sa is exactly the unsigned dot the flush takes (the
// quads' k past K meet zero activations: the rows' pad), so the bits are those of the
// portable runner. K gives column block cb's 32 code bytes of quad o (8 columns x 4 k, the
// quad layout's order) and prefetches quad o.
template <class K>
struct Avx2Bytes : Avx2 {
  static constexpr int kMaxRows = 8;
  template <int MR, bool kPrefetch>
  static void panel_block(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                          const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb = nullptr) {
    if constexpr (MR == 1) {
      one_row<kPrefetch>(j, panel, ws, wz, wo, a[0], sa, acc, sb);
    } else {
      rows<MR, kPrefetch>(j, panel, ws, wz, wo, a, sa, acc, sb);
    }
  }

  // acc[r][c0..c0+8) += group G's dequantised sums from the signed sums s[r] (sum w * a).
  // GGUF's Q8_0 (one zero point 128, scales only) takes s as it is: dot - 128 * sa = s,
  // the same integer the flush forms, so the same bits with neither the correction nor
  // its vpmulld. Other forms get the unsigned dot back and go through the flush.
  template <int MR>
  static void flush_signed(const __m256i* s, bool plain, int64_t G, int c0, const float* ws, const uint8_t* wz,
                           const float* wo, const SbSrc* sb, const int32_t* sa, int64_t ng, float (*acc)[kPanel]) {
    if (plain) {
      const int64_t at = G * kPanel + c0, hat = sb ? (G / sb->gps) * kPanel + c0 : 0;
      const __m256 sc = ws ? _mm256_loadu_ps(ws + at) : sb8(sb->d, sb->sc, nullptr, hat, at);
      for (int r = 0; r < MR; ++r) {
        float* dst = acc[r] + c0;
        _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_mul_ps(_mm256_cvtepi32_ps(s[r]), sc)));
      }
      return;
    }
    __m256i dot[MR];
    for (int r = 0; r < MR; ++r) dot[r] = _mm256_add_epi32(s[r], _mm256_set1_epi32(128 * sa[r * ng]));
    flush<MR>(dot, G, c0, ws, wz, wo, sb, sa, ng, acc);
  }

  // Two rows or more (prefill, batched decode): per group, each column block's quads into
  // one int32 accumulator per row, the code load, sign flip and |w| shared by the rows.
  // Each row's quads of the group are broadcast once into bb, which the 8 column blocks
  // read with plain loads (vpbroadcastd from a register takes a shuffle port). This
  // replaced widening the codes to int16 for vpmaddwd, whose vphaddd / vpermq and
  // zero-point correction per group took about a third of the loop's samples: in a Q8_0
  // prefill of 512 tokens on 2 threads of a Zen 3 the expert GEMMs went from 61 to 97 G
  // multiply-adds/s (generate --profile; docs/PERF.md, fifteenth session). Per 32
  // multiply-adds of a row the loop is 4 vector instructions (vpsignb, vpmaddubsw,
  // vpmaddwd, vpaddd), the fewest we found for 8-bit by 8-bit products without VNNI.
  template <int MR, bool kPrefetch>
  static void rows(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                   const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
    const int64_t n_q = g8_quads(j.k), ng = j.i4_n_groups, gq = j.i4_group / 4;
    const bool plain = j.i4_uniform_zero == 128 && !wo && (ws || !sb->m);
    const __m256i ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8(static_cast<char>(0x80));
    struct alignas(32) Quad8 {
      int8_t v[32];  // a quad's 4 activations, 8 times
    };
    thread_local std::vector<Quad8> bb;  // [MR][gq]: row r's quad q0 + i at r * gq + i
    bb.resize(static_cast<size_t>(MR * gq));
    const auto* bv = reinterpret_cast<const __m256i*>(bb.data());
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t q0 = G * gq, q1 = std::min(n_q, q0 + gq);
      for (int r = 0; r < MR; ++r)
        for (int64_t o = q0; o < q1; ++o)
          _mm256_store_si256(reinterpret_cast<__m256i*>(&bb[r * gq + (o - q0)]), bcast4(a[r] + 4 * o));
      for (int cb = 0; cb < kPanel / 8; ++cb) {
        if constexpr (!kPrefetch) {
          // The next group's quads into L1, an eighth per column block: column block cb
          // reads 32 bytes of each of the group's quads (half a line, at a 256-byte
          // stride), and waiting on L2 for those lines stalled the first of each line's
          // two readers (the expert GEMM alone, one thread: 1.12x with this).
          for (int64_t o = q1 + cb * gq / 8; o < q1 + (cb + 1) * gq / 8 && o < n_q; ++o) K::prefetch_l1(panel, o);
        }
        __m256i s[MR];
        for (int r = 0; r < MR; ++r) s[r] = _mm256_setzero_si256();
        for (int64_t o = q0; o < q1; ++o) {
          if constexpr (kPrefetch) {
            if (cb == 0) K::prefetch(panel, o);
          }
          const __m256i w = _mm256_xor_si256(K::codes(panel, o, cb), x80), u = _mm256_abs_epi8(w);
          for (int r = 0; r < MR; ++r) {
            const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(_mm256_load_si256(bv + r * gq + (o - q0)), w));
            s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, ones));
          }
        }
        flush_signed<MR>(s, plain, G, cb * 8, ws, wz, wo, sb, sa + G, ng, acc);
      }
    }
  }

  // One row (batch-1 decode, a one-row prefill block): the panel in memory order, a quad's
  // 64 columns at a time into 8 int32 accumulators, as the W8A8 kernel streams its panels
  // (rows() walks a group's quads once per column block, which read 32 bytes at a 256-byte
  // stride here, where nothing else hides the stream).
  template <bool kPrefetch>
  static void one_row(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                      const int8_t* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
    const int64_t n_q = g8_quads(j.k), ng = j.i4_n_groups, gq = j.i4_group / 4;
    const bool plain = j.i4_uniform_zero == 128 && !wo && (ws || !sb->m);
    const __m256i ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t q0 = G * gq, q1 = std::min(n_q, q0 + gq);
      __m256i s[kPanel / 8];
      for (auto& v : s) v = _mm256_setzero_si256();
      for (int64_t o = q0; o < q1; ++o) {
        if constexpr (kPrefetch) K::prefetch(panel, o);
        const __m256i av = bcast4(a + 4 * o);
        for (int cb = 0; cb < kPanel / 8; ++cb) {
          const __m256i w = _mm256_xor_si256(K::codes(panel, o, cb), x80);
          const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(av, w));
          s[cb] = _mm256_add_epi32(s[cb], _mm256_madd_epi16(p, ones));
        }
      }
      for (int cb = 0; cb < kPanel / 8; ++cb) flush_signed<1>(s + cb, plain, G, cb * 8, ws, wz, wo, sb, sa + G, ng, acc);
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
  static void prefetch_l1(const uint8_t* panel, int64_t o) {
    const char* q = reinterpret_cast<const char*>(panel + o * kI4OctetBytes);
    for (int b = 0; b < 256; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
  }
};

// 6-bit codes (the 192-byte quads) by vpmaddubsw, as 4-bit ones: u <= 63 and |a| <= 128,
// so a pair sum is at most 2 * 63 * 128 = 16128 < 32767 and nothing saturates; vpmaddwd
// with ones then gives each column's quad sum in int32, added per quad (an int16 sum of
// two quads would still fit, but 4 rows x 2 halves of int16 sums do not fit the 16 ymm
// next to the int32 ones). Chunk ch of a quad is 16 columns: its 32 nibble bytes give
// columns 0-7 (`and 0x0f`) and 8-15 (`srli 4; and 0x0f`); its 16 top-bit bytes,
// broadcast to both lanes and shifted right by 0 (lane 0: columns 0-3, 8-11) or 2
// (lane 1: 4-7, 12-15), hold the top bits of columns 0-7 in bits 0-1 of each byte and
// of columns 8-15 in bits 4-5. (This replaced widening the codes to int16 for vpmaddwd,
// with the column block's top bits rebuilt for each 8 columns: a Q6_K lm_head of 32000 x
// 2048 took 6.3-6.7 ms of a 2-thread decode step on a Zen 3; see docs/PERF.md.)
struct Avx2G6 : Avx2 {
  template <int MR, bool kPrefetch>
  static void panel_block(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                          const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb = nullptr) {
    if constexpr (MR == 1 && kPrefetch) {
      one_row(j, panel, ws, wz, wo, a[0], sa, acc, sb);
    } else {
      blocks<MR, kPrefetch>(j, panel, ws, wz, wo, a, sa, acc, sb);
    }
  }

  // Chunk ch's codes of one quad: columns 16 ch .. 16 ch + 8 into cl, the next 8 into chi.
  static void chunk(const uint8_t* quad, int ch, __m256i* cl, __m256i* chi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i sh = _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0);
    const __m256i nb = _mm256_load_si256(reinterpret_cast<const __m256i*>(quad + 32 * ch));
    const __m256i top = _mm256_srlv_epi32(
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(quad + 128 + 16 * ch))), sh);
    *cl = _mm256_or_si256(_mm256_and_si256(nb, m4), _mm256_and_si256(_mm256_slli_epi16(top, 4), m30));
    *chi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(nb, 4), m4), _mm256_and_si256(top, m30));
  }

  // Batch-1 decode: the panel in memory order, each quad's 4 chunks into 8 int32
  // accumulators, where blocks() walks a group's quads once per chunk, 48 of each quad's
  // 192 bytes at a time. The same int32 sums and flush: the same bits. With one_row_g32,
  // Q4_K_M decode at 512 (its ffn_down half Q6_K, attn_output Q5_K, lm_head Q6_K) went
  // from 102.3-117.8 to 118.4-127.5 tokens/s (docs/PERF.md, fifteenth session).
  static void one_row(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                      const int8_t* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
    const int64_t n_q = g8_quads(j.k), ng = j.i4_n_groups, gq = j.i4_group / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t q0 = G * gq, q1 = std::min(n_q, q0 + gq);
      __m256i lo[4], hi[4];
      for (int ch = 0; ch < 4; ++ch) lo[ch] = hi[ch] = _mm256_setzero_si256();
      for (int64_t o = q0; o < q1; ++o) {
        const uint8_t* quad = panel + o * kG6QuadBytes;
        for (int b = 0; b < kG6QuadBytes; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(quad) + kPrefetchBytes + b, _MM_HINT_T1);
        const __m256i av = bcast4(a + 4 * o);
        for (int ch = 0; ch < 4; ++ch) {
          __m256i cl, chi;
          chunk(quad, ch, &cl, &chi);
          lo[ch] = _mm256_add_epi32(lo[ch], _mm256_madd_epi16(_mm256_maddubs_epi16(cl, av), ones));
          hi[ch] = _mm256_add_epi32(hi[ch], _mm256_madd_epi16(_mm256_maddubs_epi16(chi, av), ones));
        }
      }
      for (int ch = 0; ch < 4; ++ch) {
        flush<1>(lo + ch, G, 16 * ch, ws, wz, wo, sb, sa + G, ng, acc);
        flush<1>(hi + ch, G, 16 * ch + 8, ws, wz, wo, sb, sa + G, ng, acc);
      }
    }
  }

  template <int MR, bool kPrefetch>
  static void blocks(const Job& j, const uint8_t* panel, const float* ws, const uint8_t* wz, const float* wo,
                     const int8_t* const* a, const int32_t* sa, float (*acc)[kPanel], const SbSrc* sb) {
    const int64_t n_q = g8_quads(j.k), ng = j.i4_n_groups, gq = j.i4_group / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t q0 = G * gq, q1 = std::min(n_q, q0 + gq);
      for (int ch = 0; ch < 4; ++ch) {
        __m256i lo[MR], hi[MR];
        for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
        for (int64_t o = q0; o < q1; ++o) {
          const uint8_t* quad = panel + o * kG6QuadBytes;
          if constexpr (kPrefetch) {
            if (ch == 0)
              for (int b = 0; b < kG6QuadBytes; b += 64)
                _mm_prefetch(reinterpret_cast<const char*>(quad) + kPrefetchBytes + b, _MM_HINT_T1);
          }
          __m256i cl, chi;
          chunk(quad, ch, &cl, &chi);
          for (int r = 0; r < MR; ++r) {
            const __m256i av = bcast4(a[r] + 4 * o);
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(cl, av), ones));
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(chi, av), ones));
          }
        }
        flush<MR>(lo, G, 16 * ch, ws, wz, wo, sb, sa + G, ng, acc);
        flush<MR>(hi, G, 16 * ch + 8, ws, wz, wo, sb, sa + G, ng, acc);
      }
    }
  }
};

}  // namespace

void run_task_avx2_i4(const Job& j, const Task& t) { i4_run_task<Avx2>(j, t); }
void run_task_avx2_g8(const Job& j, const Task& t) { i4_run_task<Avx2Bytes<G8Codes>>(j, t); }
void run_task_avx2_g6(const Job& j, const Task& t) { i4_run_task<Avx2G6>(j, t); }

}  // namespace moe::gg
