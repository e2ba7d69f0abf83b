// Group-coded experts (4-, 6- and 8-bit codes under Q8 activations) on AMX-INT8 tiles.
// Layout: grouped_gemm_int4_impl.h; contract: grouped_gemm_int4.h.
//
// TDPBSSD / TDPBSUD C[16 x 16] (int32) += A[16 x tk] (signed bytes: 16 rows of Q8
// activations, tk values of k) . B[tk/4 x 64 bytes] (tk/4 quads of k, each 16 columns x 4
// codes). B is the 8-bit layout's quad order: quad o of a panel holds 64 columns x 4 codes at
// byte 256 o, so 16 columns of tk/4 consecutive quads are a tile with a row stride of 256.
// A panel is decoded into that order 256 k at a time (16 KiB, which stays in L1 while every
// tile of the pass multiplies it; the VNNI runner decodes the nibbles again for each block
// of 4 rows). Where the differences fit a signed byte (4- and 6-bit codes; 8-bit codes
// around the one zero point 128, GGUF's Q8_0) the decode writes u - z and TDPBSSD sums the
// group's exact dot - z * sa itself; otherwise (offsets, per-group 8-bit zero points) the
// codes stay unsigned (TDPBSUD, or the 8-bit panel read in place) and the flush corrects.
//
// Exactness: tk = min(group, 64), so a group is one or two tile steps and its int32 sums are
// exact (|sum| < 2^24: grouped_gemm_int4_avx512.cpp). At a group's end its C tiles go to
// memory and each row takes the VNNI runner's f32 steps, acc + (float)(dot - z * sa) * s or
// acc + ((float)dot * s - (float)sa * offset) (with signed codes the int32 is already
// dot - z * sa), so the result is grouped_gemm_reference's, bit for bit, as on every ISA.
//
// Rows: a task's rows go in passes of up to 128 whose activations are copied into a
// zero-padded stage, [rows rounded up to 16][kp + 64] bytes (kp: the groups' k, >= K; the 64
// keeps the 16 rows of a tile out of one cache set when kp is a power of two). So a tile never
// reads past a row's K or past the activation buffer, and the last tile of a pass runs on
// zero rows whose results are dropped. Decode tasks (<= kDecodeMaxRows rows) stream their
// weights once and gain nothing from tiles: they run on the VNNI runners.
//
// The tile registers are configured at the start of each prefill task and released at its
// end (TILERELEASE), so a thread between tasks carries no AMX state into context switches.
//
// GCC 12 warns about its own intrinsics' uninitialised __Y (as in grouped_gemm_int4_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/grouped_gemm_amx_common.h"
#include "kernels/grouped_gemm_avx2_common.h"
#include "kernels/grouped_gemm_int4_avx512_common.h"
#include "kernels/grouped_gemm_int4_impl.h"

namespace moe::gg {
namespace {

constexpr int kTile = 16;                        // rows of an A or C tile
constexpr int64_t kMaxPassRows = 128;            // rows staged at once (8 tiles)
constexpr int64_t kStageBytes = int64_t(256) << 10;  // a pass's stage: in L2
constexpr int64_t kBlockK = 256;  // k of a panel decoded at once: 16 KiB, in L1 with a tile's A rows

struct alignas(64) CacheLine {  // the unit of the aligned scratch buffers
  uint8_t b[64];
};

// Tiles 0-3: C, 16 rows x 16 int32. Tiles 4 and 7: A, 16 rows x tk bytes. Tiles 5, 6: B,
// tk / 4 quads x 64 bytes.
void configure_tiles(int64_t tk) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) {
    c.rows[t] = kTile;
    c.colsb[t] = 64;
  }
  for (int t : {4, 7}) {
    c.rows[t] = kTile;
    c.colsb[t] = static_cast<uint16_t>(tk);
  }
  for (int t = 5; t < 7; ++t) {
    c.rows[t] = static_cast<uint8_t>(tk / 4);
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

inline void zero_quads(uint8_t* out, int64_t q0, int64_t q1) {  // quads q0..q1 of out
  if (q1 > q0) std::memset(out + q0 * kI4OctetBytes, 0, static_cast<size_t>((q1 - q0) * kI4OctetBytes));
}

// Each code width: its VNNI runner (decode tasks), the codes it holds for a panel, have(k)
// quads of them, and chunk q (columns 16q..16q+15) of quad o as 16 columns x 4 codes.
struct I4Codes {
  static void vnni(const Job& j, const Task& t) { run_task_avx512_vnni_i4(j, t); }
  static int64_t have(int64_t k) { return 2 * i4_octets(k); }
  static __m512i chunk(const uint8_t* panel, int64_t o, int q) {
    const __m512i v = _mm512_load_si512(panel + (o / 2) * kI4OctetBytes + 64 * q);
    return _mm512_and_si512(o & 1 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0f));
  }
};

struct G8Codes {
  static void vnni(const Job& j, const Task& t) { run_task_avx512_vnni_g8(j, t); }
  static int64_t have(int64_t k) { return g8_quads(k); }
  static __m512i chunk(const uint8_t* panel, int64_t o, int q) {
    return _mm512_load_si512(panel + o * kI4OctetBytes + 64 * q);
  }
};

struct G6Codes {
  static void vnni(const Job& j, const Task& t) { run_task_avx512_vnni_g6(j, t); }
  static int64_t have(int64_t k) { return g8_quads(k); }
  static __m512i chunk(const uint8_t* panel, int64_t o, int q) {
    return g6_chunk_avx512(panel + o * kG6QuadBytes, q);
  }
};

// Quads q0..q1 of the panel in the 8-bit order (quads past the codes' k are 0), in out
// (64-byte aligned, (q1 - q0) x 256 bytes); q0 starts a group. Folded (wz set): each code
// minus its group's zero point, u - z as a signed byte (the caller folds only codes whose
// differences fit: 4- and 6-bit codes, or 8-bit ones around 128), so the tiles' signed dot
// product is the exact dot - z * sa of the flush and the flush is left one conversion, one
// product and one sum. Unfolded: the codes, or the panel itself where it already is the
// quads (8-bit codes).
template <class Codes>
const uint8_t* decode_quads(const Job& j, const uint8_t* panel, int64_t q0, int64_t q1, const uint8_t* wz,
                            uint8_t* out) {
  const int64_t have = Codes::have(j.k), group_quads = j.i4_group / 4;
  if (!wz && std::is_same_v<Codes, G8Codes> && q1 <= have) return panel + q0 * kI4OctetBytes;
  for (int64_t o0 = q0; o0 < std::min(have, q1); o0 += group_quads) {
    __m512i z[4] = {};
    if (wz) {
      // Group G's 16 zero points of chunk q, each in the 4 bytes of its column's lane.
      const uint8_t* zg = wz + (o0 / group_quads) * kPanel;
      for (int q = 0; q < 4; ++q)
        z[q] = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zg + 16 * q))),
                                  _mm512_set1_epi32(0x01010101));
    }
    for (int64_t o = o0; o < std::min(have, o0 + group_quads); ++o)
      for (int q = 0; q < 4; ++q)
        _mm512_store_si512(out + (o - q0) * kI4OctetBytes + 64 * q, _mm512_sub_epi8(Codes::chunk(panel, o, q), z[q]));
  }
  zero_quads(out, std::max<int64_t>(0, have - q0), q1 - q0);
  return out;
}

// Group G's sums c (int32 [16][32], row-major: columns 32h..32h+31 of the panel) into
// acc (f32 [16][64]) for rows 0..mr-1: the VNNI runner's MOE_I4_FLUSH / MOE_I4_FLUSH_OFF
// steps. sa: the tile's first row's group sums, ng per row. Folded codes: c already is
// dot - z * sa, so acc + (float)c * s (the same value, the same two roundings).
template <bool kFolded>
void flush_group(int mr, int h, const int32_t (*c)[32], float (*acc)[kPanel], const int32_t* sa, int64_t ng,
                 int64_t G, const float* ws, const uint8_t* wz, const float* wo) {
  const int64_t col = G * kPanel + 32 * h;
  const __m512 s0 = _mm512_loadu_ps(ws + col), s1 = _mm512_loadu_ps(ws + col + 16);
  if constexpr (kFolded) {
    for (int r = 0; r < mr; ++r) {
      float* dst = acc[r] + 32 * h;
      const __m512 p0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[r])), s0);
      const __m512 p1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[r] + 16)), s1);
      _mm512_store_ps(dst, _mm512_add_ps(_mm512_load_ps(dst), p0));
      _mm512_store_ps(dst + 16, _mm512_add_ps(_mm512_load_ps(dst + 16), p1));
    }
    return;
  }
  if (wo) {
    const __m512 f0 = _mm512_loadu_ps(wo + col), f1 = _mm512_loadu_ps(wo + col + 16);
    for (int r = 0; r < mr; ++r) {
      const __m512 sav = _mm512_set1_ps(static_cast<float>(sa[r * ng + G]));
      float* dst = acc[r] + 32 * h;
      const __m512 p0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[r])), s0);
      const __m512 p1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[r] + 16)), s1);
      _mm512_store_ps(dst, _mm512_add_ps(_mm512_load_ps(dst), _mm512_sub_ps(p0, _mm512_mul_ps(sav, f0))));
      _mm512_store_ps(dst + 16, _mm512_add_ps(_mm512_load_ps(dst + 16), _mm512_sub_ps(p1, _mm512_mul_ps(sav, f1))));
    }
    return;
  }
  const __m512i z0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wz + col)));
  const __m512i z1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wz + col + 16)));
  for (int r = 0; r < mr; ++r) {
    // z * sum(a) by vpmaddwd, as in the VNNI runner (the sum fits int16: |sum| <= 128 * 127).
    const __m512i sav = _mm512_set1_epi32(sa[r * ng + G] & 0xffff);
    float* dst = acc[r] + 32 * h;
    const __m512i i0 = _mm512_sub_epi32(_mm512_load_si512(c[r]), _mm512_madd_epi16(z0, sav));
    const __m512i i1 = _mm512_sub_epi32(_mm512_load_si512(c[r] + 16), _mm512_madd_epi16(z1, sav));
    _mm512_store_ps(dst, _mm512_add_ps(_mm512_load_ps(dst), _mm512_mul_ps(_mm512_cvtepi32_ps(i0), s0)));
    _mm512_store_ps(dst + 16, _mm512_add_ps(_mm512_load_ps(dst + 16), _mm512_mul_ps(_mm512_cvtepi32_ps(i1), s1)));
  }
}

// Group G of columns 32h..32h+31 into C tiles CA, CB, the activations through A tile TA.
// Folded codes are signed (TDPBSSD), the others unsigned (TDPBSUD); activations signed.
#define MOE_AMX_DP(C, A, B)    \
  if constexpr (kFolded) {     \
    _tile_dpbssd(C, A, B);     \
  } else {                     \
    _tile_dpbsud(C, A, B);     \
  }
#define MOE_AMX_GROUP(CA, CB, TA, G)                                          \
  _tile_zero(CA);                                                            \
  _tile_zero(CB);                                                            \
  for (int64_t k0 = (G) * g; k0 < ((G) + 1) * g; k0 += tk) {                 \
    const uint8_t* bq = b + ((k0 - kb) / 4) * kI4OctetBytes + 128 * h;       \
    _tile_loadd(TA, at + k0, lds);                                           \
    _tile_loadd(5, bq, kI4OctetBytes);                                       \
    MOE_AMX_DP(CA, TA, 5);                                                   \
    _tile_loadd(6, bq + 64, kI4OctetBytes);                                  \
    MOE_AMX_DP(CB, TA, 6);                                                   \
  }                                                                          \
  if (pf) {                                                                  \
    for (int l = 0; l < pf_lines; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T1); \
    pf += 64 * pf_lines;                                                     \
  }
#define MOE_AMX_FLUSH(CA, CB, G)                     \
  _tile_stored(CA, c[0], sizeof c[0]);               \
  _tile_stored(CB, c[0] + 16, sizeof c[0]);          \
  flush_group<kFolded>(mr, h, c, acc, sa, ng, G, ws, wz, wo);

// One 16-row tile of the stage against groups G0..G1 of a panel, decoded into b (from group
// G0's first quad): acc[r][0..64) += the rows' dequantised sums of those groups, for rows
// 0..mr-1. The columns go in two halves of 32, and the groups alternate between two pairs
// of C tiles (0-1, 2-3) and two A tiles (4, 7): group G's sums are stored and flushed while
// the tile unit multiplies group G + 1, instead of the vector flush and the tile multiplies
// waiting for each other. pf (or null): pf_lines cache lines of the next panel to prefetch
// per group step.
template <bool kFolded>
void tile_rows(const Job& j, const int8_t* at, int64_t lds, const uint8_t* b, int64_t G0, int64_t G1, int mr,
               const int32_t* sa, const float* ws, const uint8_t* wz, const float* wo, float (*acc)[kPanel],
               const char*& pf, int pf_lines) {
  const int64_t ng = j.i4_n_groups, g = j.i4_group, tk = std::min<int64_t>(g, 64), kb = G0 * g;
  alignas(64) int32_t c[kTile][32];
  for (int h = 0; h < 2; ++h) {
    int64_t G = G0;
    for (; G + 1 < G1; G += 2) {
      MOE_AMX_GROUP(0, 1, 4, G)
      if (G > G0) {
        MOE_AMX_FLUSH(2, 3, G - 1)
      }
      MOE_AMX_GROUP(2, 3, 7, G + 1)
      MOE_AMX_FLUSH(0, 1, G)
    }
    if (G < G1) {  // an odd count: the last group in tiles 0-1
      MOE_AMX_GROUP(0, 1, 4, G)
      if (G > G0) {
        MOE_AMX_FLUSH(2, 3, G - 1)
      }
      MOE_AMX_FLUSH(0, 1, G)
    } else {
      MOE_AMX_FLUSH(2, 3, G1 - 1)
    }
  }
}
#undef MOE_AMX_DP
#undef MOE_AMX_GROUP
#undef MOE_AMX_FLUSH

template <class Codes>
void amx_run_task(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  if (rows <= kDecodeMaxRows) return Codes::vnni(j, t);
  const int64_t ng = j.i4_n_groups, g = j.i4_group, kp = ng * g, lds = kp + 64;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t pass_rows = std::clamp<int64_t>(kStageBytes / lds / kTile * kTile, kTile, kMaxPassRows);
  // 64-byte aligned buffers: the stage, the decoded panel; and the sums.
  thread_local std::vector<CacheLine> stage_buf, panel_buf;
  thread_local std::vector<int32_t> sa;
  stage_buf.resize(static_cast<size_t>(pass_rows * lds / 64 + 1));
  // Groups decoded at a time: kBlockK values of k, 64 columns x kBlockK bytes, which stay
  // in L1 while every tile of the pass multiplies them.
  const int64_t block_groups = std::max<int64_t>(1, kBlockK / g);
  panel_buf.resize(static_cast<size_t>(block_groups * g / 4 * kI4OctetBytes / 64));
  alignas(64) float acc[kMaxPassRows / kTile][kTile][kPanel];  // the pass's sums of a panel, 32 KiB
  sa.resize(static_cast<size_t>(pass_rows * ng));
  auto* stage = reinterpret_cast<int8_t*>(stage_buf.data());
  auto* decoded = reinterpret_cast<uint8_t*>(panel_buf.data());
  // Lines of the next panel per group step of a tile (2 halves x ng steps).
  const int pf_lines = static_cast<int>((j.panel_stride / 64 + 2 * ng - 1) / (2 * ng));
  const I4TaskSides sides(j, t);
  // Codes minus zero points fit a signed byte for 4- and 6-bit codes, and for 8-bit codes
  // around the one zero point 128 (GGUF's Q8_0); per-group 8-bit zero points and the
  // offset form (a task's panels all have offsets or none) keep the unsigned codes and
  // the flush's correction.
  const bool fold = [&] {
    const float *ws, *wo;
    const uint8_t* wz;
    sides.panel(t.p0, &ws, &wz, &wo);
    return !wo && (!std::is_same_v<Codes, G8Codes> || (!j.i4_zero && j.i4_uniform_zero == 128));
  }();
  configure_tiles(std::min<int64_t>(g, 64));
  for (int64_t p0 = 0; p0 < rows; p0 += pass_rows) {
    const int64_t pr = std::min(pass_rows, rows - p0), n_tiles = (pr + kTile - 1) / kTile;
    for (int64_t r = 0; r < n_tiles * kTile; ++r) {
      int8_t* dst = stage + r * lds;
      if (r < pr) {
        const auto* a = reinterpret_cast<const int8_t*>(j.a + (r0 + p0 + r) * j.lda_bytes);
        std::memcpy(dst, a, static_cast<size_t>(j.k));
        std::memset(dst + j.k, 0, static_cast<size_t>(kp - j.k));
        if (!fold) i4_group_sums_avx2(a, j.k, g, ng, sa.data() + r * ng, i4_group_sums);
      } else {
        std::memset(dst, 0, static_cast<size_t>(kp));
      }
    }
    for (int64_t P = t.p0; P < t.p1; ++P) {
      const auto* panel = reinterpret_cast<const uint8_t*>(j.w + t.expert * j.expert_stride + P * j.panel_stride);
      const float *ws, *wo;
      const uint8_t* wz;
      sides.panel(P, &ws, &wz, &wo);
      // The pass's first tile prefetches the task's next panel into L2, a few lines per
      // group step (the weights come from DRAM; the decode would otherwise wait for them).
      const char* pf = P + 1 < t.p1 ? j.w + t.expert * j.expert_stride + (P + 1) * j.panel_stride : nullptr;
      for (int64_t tb = 0; tb < n_tiles; ++tb) std::memset(acc[tb], 0, sizeof acc[tb]);
      for (int64_t G0 = 0; G0 < ng; G0 += block_groups) {
        const int64_t G1 = std::min(ng, G0 + block_groups);
        const uint8_t* b =
            decode_quads<Codes>(j, panel, G0 * g / 4, G1 * g / 4, fold ? wz : nullptr, decoded);
        compiler_barrier();
        for (int64_t tb = 0; tb < n_tiles; ++tb) {
          const int mr = static_cast<int>(std::min<int64_t>(kTile, pr - tb * kTile));
          const int8_t* at = stage + tb * kTile * lds;
          const int32_t* st = sa.data() + tb * kTile * ng;
          const char* no_pf = nullptr;
          const char*& tpf = tb == 0 ? pf : no_pf;
          if (fold) {
            tile_rows<true>(j, at, lds, b, G0, G1, mr, st, ws, wz, wo, acc[tb], tpf, pf_lines);
          } else {
            tile_rows<false>(j, at, lds, b, G0, G1, mr, st, ws, wz, wo, acc[tb], tpf, pf_lines);
          }
        }
      }
      for (int64_t tb = 0; tb < n_tiles; ++tb) {
        const int mr = static_cast<int>(std::min<int64_t>(kTile, pr - tb * kTile));
        for (int r = 0; r < mr; ++r) {
          const int64_t row = r0 + p0 + tb * kTile + r;
          float as;
          std::memcpy(&as, j.a + row * j.lda_bytes + j.a_scale_off, 4);
          i4_epilogue_row_avx512(j, acc[tb][r], as, j.c + row * j.ldc_bytes, P * per, valid_cols(j, P));
        }
      }
    }
  }
  _tile_release();
}

}  // namespace

void run_task_amx_i4(const Job& j, const Task& t) { amx_run_task<I4Codes>(j, t); }
void run_task_amx_g8(const Job& j, const Task& t) { amx_run_task<G8Codes>(j, t); }
void run_task_amx_g6(const Job& j, const Task& t) { amx_run_task<G6Codes>(j, t); }

}  // namespace moe::gg
