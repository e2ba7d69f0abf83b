// Private to grouped_gemm_int4*.cpp: the packed int4 layout and the pieces the portable
// and AVX2 runners share (internal linkage, see the ODR note in grouped_gemm_impl.h).
//
// Packed layout (panels of 64 columns as every dtype, grouped_gemm_impl.h; gated panels
// hold 32 gate + 32 up columns): a panel is [ceil(K/8) octets][64 columns][4 bytes],
// 256 bytes per octet of k. Byte i (0..3) of column c in octet o holds
//   low nibble  = u[c, 8o + i],   high nibble = u[c, 8o + 4 + i].
// So one 32-byte load is 8 columns x 8 k: `and 0x0f` gives the k quad 8o..8o+3 and
// `srli 4; and 0x0f` the quad 8o+4..8o+7, each in the [8 columns][4 k] order
// vpmaddubsw + vpmaddwd reduce to one int32 per column. Padding (k >= K, columns past n)
// is nibble 0 with zero point 0 and scale 0.
// 8-bit codes (code_bits 8, GGUF's Q8_0): a panel is [ceil(K/4) quads]
// [64 columns][4 bytes], byte i of column c in quad o holding u[c, 4o + i], the order
// vpdpbusd reduces (16 columns x 4 k per 64-byte load); padding is code 0.
// 6-bit codes (code_bits 6, GGUF's Q5_* and Q6_K): a panel is [ceil(K/4) quads][192
// bytes]: per quad, 4 chunks of 16 columns, first their low nibbles (chunk q's 32 bytes at
// 32q: byte b holds column 16q + b/4 in its low nibble and 16q + 8 + b/4 in its high one,
// k = 4o + b%4), then their top 2 bits (chunk q's 16 bytes at 128 + 16q: bits 2s..2s+1 of
// byte b belong to column 16q + 4s + b/4, k = 4o + b%4). So `and 0x0f` / `srli 4; and
// 0x0f` of a chunk's 32 bytes are its columns 0-7 / 8-15 in the quad layout's [column][4 k]
// order, and the 16 bytes broadcast to four lanes and shifted right by 2s per lane are the
// top bits in the same order: 0.75 byte per code instead of 1. Padding is code 0.
// Scales (f32), zero points (u8) or offsets (f32): PackedExperts::w_scale / w_zero /
// w_offset, entry e * q_stride + (P * n_groups + G) * 64 + c: a group's 64 column values
// are contiguous. Per group and column the runners add, in this order,
//   zero points:  acc = acc + (float)(dot - z * sa) * s               (int32 exact)
//   offsets:      acc = acc + ((float)dot * s - (float)sa * offset)
// with dot = sum over the group of q_a * u and sa = sum of q_a (both exact int32 below
// 2^24, so exact as floats): two products and a difference, no FMA (the project builds
// with -ffp-contract=off), the same on every ISA.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/dtype.h"

#include "kernels/grouped_gemm_generic.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

inline constexpr int64_t kI4OctetBytes = kPanel * 4;  // 256: one octet of k for 64 columns
inline constexpr int kI4MaxRows = 4;                  // rows per pass of the portable runner

inline int64_t i4_octets(int64_t k) { return (k + 7) / 8; }
inline int64_t i4_panel_bytes(int64_t k) { return i4_octets(k) * kI4OctetBytes; }

// Byte and shift of u[c, k] inside a panel.
inline int64_t i4_byte(int64_t k, int c) { return (k / 8) * kI4OctetBytes + c * 4 + (k & 3); }
inline int i4_shift(int64_t k) { return (k & 4) ? 4 : 0; }

// The 8-bit code layout: quads of k, 256 bytes each.
inline int64_t g8_quads(int64_t k) { return (k + 3) / 4; }
inline int64_t g8_panel_bytes(int64_t k) { return g8_quads(k) * kI4OctetBytes; }
inline int64_t g8_byte(int64_t k, int c) { return (k / 4) * kI4OctetBytes + c * 4 + (k & 3); }

// The 6-bit code layout: quads of k, 192 bytes each.
inline constexpr int64_t kG6QuadBytes = kPanel * 3;
inline int64_t g6_panel_bytes(int64_t k) { return g8_quads(k) * kG6QuadBytes; }
// Where u[c, k] lives in its quad (q points at the quad): the nibble byte and shift, and
// the top-bits byte and shift.
struct G6Place {
  int64_t nib, top;
  int nib_shift, top_shift;
};
inline G6Place g6_place(int c, int i) {  // i = k % 4
  const int q = c / 16, cc = c % 16;
  return {q * 32 + (cc % 8) * 4 + i, 128 + q * 16 + (cc % 4) * 4 + i, cc >= 8 ? 4 : 0, 2 * (cc / 4)};
}
inline int g6_code(const uint8_t* quad, int c, int i) {
  const G6Place p = g6_place(c, i);
  return ((quad[p.nib] >> p.nib_shift) & 0x0f) | (((quad[p.top] >> p.top_shift) & 0x03) << 4);
}
// Each byte holds codes of 2 or 4 columns: the caller's bits are cleared, then set.
inline void g6_set(uint8_t* quad, int c, int i, int u) {
  const G6Place p = g6_place(c, i);
  quad[p.nib] = static_cast<uint8_t>((quad[p.nib] & ~(0x0f << p.nib_shift)) | ((u & 0x0f) << p.nib_shift));
  quad[p.top] = static_cast<uint8_t>((quad[p.top] & ~(0x03 << p.top_shift)) | (((u >> 4) & 0x03) << p.top_shift));
}
// A panel's bytes for `bits`-bit codes.
inline int64_t coded_panel_bytes(int bits, int64_t k) {
  return bits == 8 ? g8_panel_bytes(k) : bits == 6 ? g6_panel_bytes(k) : i4_panel_bytes(k);
}

// One group's flush for one row and column (the order in the layout comment above).
inline float i4_flush(float acc, int32_t dot, int32_t sa, float s, const uint8_t* z, const float* off, int64_t i) {
  if (off) {
    const float p = static_cast<float>(dot) * s, q = static_cast<float>(sa) * off[i];
    return acc + (p - q);
  }
  return acc + static_cast<float>(dot - int32_t(z[i]) * sa) * s;
}

// sa[G] = sum of the row's int8 activations over group G (k < K only: the bytes past K
// are the row's zero pad and f32 scale, which meet zero nibbles in the dot product but
// must not enter the zero-point correction z * sa).
inline void i4_group_sums(const int8_t* a, int64_t K, int64_t group, int64_t n_groups, int32_t* sa) {
  for (int64_t G = 0; G < n_groups; ++G) {
    const int64_t k0 = G * group, k1 = k0 + group < K ? k0 + group : K;
    int32_t s = 0;
    for (int64_t k = k0; k < k1; ++k) s += a[k];
    sa[G] = s;
  }
}

// Epilogue of one row x one panel: acc[64] (packed column order) -> output columns
// [col0, col0 + nv) of crow, exactly as W8A8's: t = acc * a_scale, then act(gate) * up.
inline void i4_epilogue_row(const Job& j, const float* acc, float a_scale, char* crow, int64_t col0, int nv) {
  float t[kPanel];
  for (int c = 0; c < kPanel; ++c) t[c] = acc[c] * a_scale;
  scalar_epilogue_row(j, t, crow, col0, nv);
}

#if defined(__AVX512F__)
// 16 columns of a super-block value: the f16 h[0..16) widened, times the i8 q8[0..16) or
// u8 u8[0..16) factor when one is given (both exact conversions, one rounding). The one
// definition of these products for the AVX-512 builds: i4_expand_panel and the decode flush
// (grouped_gemm_int4_avx512.cpp, sb_value) both call it, so they give the same scales.
inline __m512 sb_product16(const uint16_t* h, const int8_t* q8, const uint8_t* u8) {
  const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  if (q8) return _mm512_mul_ps(v, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q8)))));
  if (u8) return _mm512_mul_ps(v, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u8)))));
  return v;
}
#endif

// Super-block form: the f32 scales (and offsets) of one panel's groups, [group][64],
// expanded from D * sc and M * mn into s / o (the runners then read them as the plain
// form's w_scale / w_offset: the same values, so the same bits). Once per task and panel
// (I4TaskSides), so the weight stream stays the compact one; ~2 products per group and
// column against the group's 32 (or 16) multiply-adds per row.
inline void i4_expand_panel(const Job& j, int64_t expert, int64_t P, float* s, float* o) {
  const int64_t ng = j.i4_n_groups, gps = j.i4_sb_groups, nsb = (ng + gps - 1) / gps;
  const uint16_t* d = j.i4_sb_d + expert * j.i4_sb_stride + P * nsb * kPanel;
  const uint16_t* m = j.i4_sb_m ? j.i4_sb_m + expert * j.i4_sb_stride + P * nsb * kPanel : nullptr;
  const int8_t* sc = j.i4_sc ? j.i4_sc + expert * j.q_stride + P * ng * kPanel : nullptr;
  const uint8_t* mn = j.i4_mn ? j.i4_mn + expert * j.q_stride + P * ng * kPanel : nullptr;
  // f16 -> f32 and int -> f32 are exact, so every ISA forms the same products.
  // (q8, u8 both null: one group per super-block, unit factors, the f16 value itself.)
  auto row = [](const uint16_t* h, const int8_t* q8, const uint8_t* u8, float* out) {
#if defined(__AVX512F__)
    for (int c = 0; c < kPanel; c += 16)
      _mm512_storeu_ps(out + c, sb_product16(h + c, q8 ? q8 + c : nullptr, u8 ? u8 + c : nullptr));
#elif defined(__AVX2__) && defined(__F16C__)
    const void* f = q8 ? static_cast<const void*>(q8) : u8;
    for (int c = 0; c < kPanel; c += 8) {
      __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + c)));
      if (f) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(f) + c));
        v = _mm256_mul_ps(v, _mm256_cvtepi32_ps(q8 ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)));
      }
      _mm256_storeu_ps(out + c, v);
    }
#else
    const bool f = q8 || u8;
    for (int c = 0; c < kPanel; ++c)
      out[c] = f ? f16_to_f32(h[c]) * static_cast<float>(q8 ? int(q8[c]) : int(u8[c])) : f16_to_f32(h[c]);
#endif
  };

  for (int64_t G = 0; G < ng; ++G) {
    row(d + (G / gps) * kPanel, sc ? sc + G * kPanel : nullptr, nullptr, s + G * kPanel);
    if (m) row(m + (G / gps) * kPanel, nullptr, mn ? mn + G * kPanel : nullptr, o + G * kPanel);
  }
}

// One panel's super-block scale sources (PackedExperts::sb_groups > 0), for runners that
// form D * sc and M * mn inside their flush (i4_expand_panel's products, in registers).
struct SbSrc {
  const uint16_t* d = nullptr;  // f16 [n_superblocks][64]
  const uint16_t* m = nullptr;  // f16 [n_superblocks][64], offset form only
  const int8_t* sc = nullptr;   // [n_groups][64], or null (unit factors)
  const uint8_t* mn = nullptr;  // [n_groups][64], or null
  int64_t gps = 1;              // groups per super-block
};

// The per-group scales, zero points and offsets of task t's panels as the runners read
// them: pointers into the Job (plain form), or for the super-block form the task's panels
// expanded once into this thread's buffers, which every row block of the task reuses;
// or, with expand false, not expanded: panel() then gives null ws / wo and the SbSrc
// (decode: one row block reads each panel once, and the expansion pass was ~11 % of a
// decode step, Q4_0 GGUF on the AVX512-VNNI runner).
class I4TaskSides {
 public:
  I4TaskSides(const Job& j, const Task& t, bool expand = true) : j_(j), t_(t) {
    if (!j.i4_zero && j.i4_uniform_zero >= 0) {
      // One zero point for all: a panel's [group][64] of it, which every panel reads.
      // Refilled only when the size or the code changes: a decode step runs many tasks of
      // the same few formats.
      thread_local std::vector<uint8_t> z;
      const auto n = static_cast<size_t>(j.i4_n_groups * kPanel);
      const auto code = static_cast<uint8_t>(j.i4_uniform_zero);
      if (z.size() != n || z[0] != code) z.assign(n, code);
      uz_ = z.data();
    }
    if (j.i4_sb_groups == 0) return;
    if (!expand) {
      lazy_ = true;
      return;
    }
    thread_local std::vector<float> s, o;
    const int64_t per = j.i4_n_groups * kPanel, n = (t.p1 - t.p0) * per;
    s.resize(static_cast<size_t>(n));
    o.resize(j.i4_sb_m ? s.size() : 0);
    for (int64_t P = t.p0; P < t.p1; ++P)
      i4_expand_panel(j, t.expert, P, s.data() + (P - t.p0) * per, j.i4_sb_m ? o.data() + (P - t.p0) * per : nullptr);
    sb_s_ = s.data();
    sb_o_ = j.i4_sb_m ? o.data() : nullptr;
  }
  // Panel P's [group][64] scales ws, and zero points wz or offsets wo (the other null).
  // Not expanded: ws and wo null, *sb the panel's sources (sb must be given then).
  void panel(int64_t P, const float** ws, const uint8_t** wz, const float** wo, SbSrc* sb = nullptr) const {
    const int64_t per = j_.i4_n_groups * kPanel, q0 = t_.expert * j_.q_stride + P * per;
    *wz = j_.i4_zero ? j_.i4_zero + q0 : uz_;
    if (lazy_) {
      const int64_t gps = j_.i4_sb_groups, nsb = (j_.i4_n_groups + gps - 1) / gps;
      const int64_t d0 = t_.expert * j_.i4_sb_stride + P * nsb * kPanel;
      *ws = nullptr;
      *wo = nullptr;
      *sb = {j_.i4_sb_d + d0, j_.i4_sb_m ? j_.i4_sb_m + d0 : nullptr, j_.i4_sc ? j_.i4_sc + q0 : nullptr,
             j_.i4_mn ? j_.i4_mn + q0 : nullptr, gps};
    } else if (sb_s_) {
      *ws = sb_s_ + (P - t_.p0) * per;
      *wo = sb_o_ ? sb_o_ + (P - t_.p0) * per : nullptr;
    } else {
      *ws = j_.w_scale + q0;
      *wo = j_.i4_offset ? j_.i4_offset + q0 : nullptr;
    }
  }

 private:
  const Job& j_;
  const Task& t_;
  const float* sb_s_ = nullptr;
  const float* sb_o_ = nullptr;
  const uint8_t* uz_ = nullptr;  // the uniform zero point's panel of codes, or null
  bool lazy_ = false;            // super-block scales left for the runner (expand false)
};

// Runners whose panel_block takes a trailing const SbSrc* (AVX-512) form the super-block
// scales themselves in decode.
template <class K>
constexpr bool kFormsSbScales = requires { K::kFormsSbScales; };

// The task driver the ISA runners share. K supplies kMaxRows and
//   template <int MR, bool kPrefetch> static void panel_block(const Job&, const uint8_t* panel,
//       const float* ws, const uint8_t* wz, const float* wo, const int8_t* const* a,
//       const int32_t* sa, float (*acc)[kPanel]);
// (wz the zero points or wo the offsets of the panel's groups: the other is null)
// which adds one panel's dequantised group sums for rows a[0..MR) into acc, and two
// vector forms of the scalar helpers, same results:
//   static void group_sums(...)    i4_group_sums' signature (prefill tasks are one panel
//                                  each, so every task sums its rows again),
//   static void epilogue_row(const Job&, float* acc, float a_scale, char* crow,
//                            int64_t col0, int nv)   i4_epilogue_row's operations lane by
//                                  lane (acc may be overwritten; a gated panel's
//                                  activation is 32 exp and divides per row). The task's
// rows go in blocks of at most kMaxRows, as even as possible (7 rows at 6: 4 + 3), each
// block's group sums computed once; decode (<= kDecodeMaxRows rows) prefetches the
// weight stream. A row's result does not depend on its block (integer sums, then the
// same float steps), so the blocking is free to differ between ISAs.
template <class K, int MR, bool kPrefetch>
void i4_rows_block(const Job& j, const Task& t, const I4TaskSides& sides, int64_t row0, const int8_t* const* a,
                   const int32_t* sa) {
  const int64_t per = j.gated ? kGateCols : kPanel;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    const auto* panel = reinterpret_cast<const uint8_t*>(j.w + t.expert * j.expert_stride + P * j.panel_stride);
    const float *ws, *wo;
    const uint8_t* wz;
    SbSrc sb;
    sides.panel(P, &ws, &wz, &wo, &sb);
    alignas(64) float acc[MR][kPanel] = {};
    if constexpr (kFormsSbScales<K>) {
      K::template panel_block<MR, kPrefetch>(j, panel, ws, wz, wo, a, sa, acc, ws ? nullptr : &sb);
    } else {
      K::template panel_block<MR, kPrefetch>(j, panel, ws, wz, wo, a, sa, acc);
    }
    for (int r = 0; r < MR; ++r) {
      float as;
      std::memcpy(&as, reinterpret_cast<const char*>(a[r]) + j.a_scale_off, 4);
      K::epilogue_row(j, acc[r], as, j.c + (row0 + r) * j.ldc_bytes, P * per, valid_cols(j, P));
    }
  }
}

// i4_rows_block for a run-time row count mr in [1, K::kMaxRows].
template <class K, bool kPrefetch, int MR = 1>
void i4_run_rows(int mr, const Job& j, const Task& t, const I4TaskSides& sides, int64_t row0, const int8_t* const* a,
                 const int32_t* sa) {
  if constexpr (MR < K::kMaxRows) {
    if (mr > MR) return i4_run_rows<K, kPrefetch, MR + 1>(mr, j, t, sides, row0, a, sa);
  }
  i4_rows_block<K, MR, kPrefetch>(j, t, sides, row0, a, sa);
}

template <class K>
void i4_run_task(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0, ng = j.i4_n_groups;
  // Group sums of one row block (kMaxRows x 7168 / 32 ints at most: a few KiB).
  thread_local std::vector<int32_t> sa;
  sa.resize(static_cast<size_t>(K::kMaxRows * ng));
  const bool decode = rows <= kDecodeMaxRows;
  const I4TaskSides sides(j, t, !(kFormsSbScales<K> && decode));
  const int64_t nb = (rows + K::kMaxRows - 1) / K::kMaxRows;
  int64_t rb = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
    const int8_t* a[K::kMaxRows];
    for (int r = 0; r < mr; ++r) {
      a[r] = reinterpret_cast<const int8_t*>(j.a + (r0 + rb + r) * j.lda_bytes);
      K::group_sums(a[r], j.k, j.i4_group, ng, sa.data() + r * ng);
    }
    if (decode) {
      i4_run_rows<K, true>(mr, j, t, sides, r0 + rb, a, sa.data());
    } else {
      i4_run_rows<K, false>(mr, j, t, sides, r0 + rb, a, sa.data());
    }
    rb += mr;
  }
}

}  // namespace
}  // namespace moe::gg
