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
// Scales (f32) and zero points (u8): PackedExperts::w_scale / w_zero, entry
// e * q_stride + (P * n_groups + G) * 64 + c: a group's 64 column values are contiguous.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/grouped_gemm_generic.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

inline constexpr int64_t kI4OctetBytes = kPanel * 4;  // 256: one octet of k for 64 columns
inline constexpr int kI4MaxRows = 4;                  // rows register-blocked per pass over a panel

inline int64_t i4_octets(int64_t k) { return (k + 7) / 8; }
inline int64_t i4_panel_bytes(int64_t k) { return i4_octets(k) * kI4OctetBytes; }

// Byte and shift of u[c, k] inside a panel.
inline int64_t i4_byte(int64_t k, int c) { return (k / 8) * kI4OctetBytes + c * 4 + (k & 3); }
inline int i4_shift(int64_t k) { return (k & 4) ? 4 : 0; }

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

}  // namespace
}  // namespace moe::gg
