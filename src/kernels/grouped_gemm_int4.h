// W4A8 routed experts: 4-bit group-quantised weights, int8 (Q8) activations.
//
// Weights: along k, groups of g in {32, 64, 128} values (the last group of a k that g
// does not divide is shorter: the fixtures' k of 16..40 need it, real checkpoints'
// 768..7168 never do) share one f32 scale and one zero point per output column:
//   w[n, k] ~= (u[n, k] - z[n, k / g]) * scale[n, k / g],   u, z in [0, 15].
// Two quantisers from float (quantize_weight_group_q4), both round to nearest even:
//   with zero points (asymmetric, GPTQ/AWQ "sym=False"): mn = min(0, min v), mx = max(0,
//     max v), scale = (mx - mn) / 15, z = nearbyint(-mn * 15 / (mx - mn)), u = clamp(
//     nearbyint(v * 15 / (mx - mn)) + z, 0, 15); all 16 levels, 0 exactly representable;
//   symmetric: scale = amax / 7, q = clamp(nearbyint(v * 7 / amax), -7, 7), stored as
//     u = q + 8 with z = 8 (15 levels, the int8 rule with 7 for 127).
// Activations: the W8A8 Q8 rows (kernels/quant.h), so the dispatch payload of int4
// experts is the same int8 rows as W8A8's and the same smooth / static-scale options
// apply. The GEMM, per row and output column:
//   acc = 0;  for each group G in k order:  isum = sum_{k in G} q_a[k] * (u[k] - z[G])
//                                           (exact int32)
//             acc = acc + (float)isum * scale[G]      (a multiply, then an add: no FMA)
//   out = act(acc * a_scale) as W8A8's epilogue (grouped_gemm.h).
// Every ISA performs exactly these operations, so all agree bit for bit with
// grouped_gemm_reference, and a row's result does not depend on the other rows.
//
// In PackedExperts: dtype I8 (the activation dtype, so MoeLayer, the dispatch and
// fused_moe treat the experts as W8A8) with int4_group = g > 0; w_scale f32 and w_zero
// u8, both [E, n_panels * n_groups * 64] (layout: grouped_gemm_int4_impl.h).
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm.h"

namespace moe {

// k values per group the int4 kernels accept.
bool valid_int4_group(int64_t g);  // 32, 64 or 128
inline int64_t int4_n_groups(int64_t k, int64_t g) { return (k + g - 1) / g; }

// Allocates n_experts [n, k] int4 matrices with groups of `group` along k. zero_points:
// which quantiser pack_expert / pack_expert_gated use (see above); matrices packed with
// pack_expert_q4 carry their own zero points either way.
PackedExperts make_packed_experts_int4(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t group,
                                       bool zero_points = true);

// Quantises v[0..len) (one column's group) to u[0..len) in [0, 15]; returns the scale and
// writes the zero point (8 when symmetric). A zero group: scale 0, u = z.
float quantize_weight_group_q4(const float* v, int64_t len, bool zero_points, uint8_t* u, uint8_t* zero);

// Packs an already quantised expert: u, U8 [n, k] in [0, 15]; zero, U8 [n, n_groups] in
// [0, 15]; scale, f32/bf16/f16 [n, n_groups] (finite, >= 0). w[n, k] = (u - zero) * scale.
void pack_expert_q4(PackedExperts& p, int64_t e, const Tensor& u, const Tensor& zero, const Tensor& scale);
// One already quantised weight as pack_expert_q4 takes it.
struct Q4Weight {
  Tensor u, zero, scale;
};
// Expert e of a gated MLP from quantised weights: gate and up stacked into w13 (gate's
// rows first, the layout of make_packed_experts_int4(gated)), down into w2.
void pack_gated_expert_q4(PackedExperts& w13, PackedExperts& w2, int64_t e, const Q4Weight& gate, const Q4Weight& up,
                          const Q4Weight& down);
// Expert e's unsigned codes U8 [n, k], zero points U8 [n, n_groups], scales f32 [n, n_groups].
void unpack_expert_q4(const PackedExperts& p, int64_t e, Tensor& u, Tensor& zero, Tensor& scale);

// Bytes the GEMM reads per expert (codes + scales + zero points or offsets), for
// bandwidth figures.
size_t int4_bytes_per_expert(const PackedExperts& p);

// ---- Group-coded weights in general: the formats GGUF's integer types load into --------
// (loader/gguf/gguf_experts.h). Per group of `group` k values and output column:
//   zero-point form:  w = (u - z) * s        (u, z in [0, 2^bits); s f32, any finite sign)
//   offset form:      w = u * s - offset     (s, offset f32, finite)
// with the GEMM's group steps of grouped_gemm_int4_impl.h. bits 4 is the int4 layout
// above (groups 32, 64, 128); bits 8 holds one code per byte (groups 16, 32, 64, 128),
// for codes of 5 to 8 bits. Activations are the same int8 Q8 rows as W4A8's.
struct CodedFormat {
  int64_t group = 32;
  int bits = 4;          // 4, 6 or 8
  bool offsets = false;  // offset form (else zero points)
  // > 0: super-block scales (PackedExperts::sb_groups): per group an i8 sc (and a u8 mn),
  // per sb_groups groups an f16 D (and M); scale = D * sc, offset = M * mn. GGUF's
  // K-quants store exactly this (Q4_K: 4.6 bits per weight in memory instead of 6).
  // 1: one group per super-block, the factors 1 and not stored: an f16 scale (and
  // offset) per group, GGUF's Q4_0 / Q8_0 / Q5_0 d and Q4_1 / Q5_1 d and -m exactly.
  int64_t sb_groups = 0;
  // >= 0 (zero-point form only): every group's zero point is this code, held once
  // (PackedExperts::uniform_zero) instead of a byte per group: GGUF's symmetric types
  // (Q4_0 8, Q5_0 16, Q8_0 128, Q6_K 32), 1 byte in 19 of a Q4_0 weight's. -1: per group.
  int zero = -1;
};
bool valid_coded_format(const CodedFormat& f);
CodedFormat coded_format(const PackedExperts& p);  // p must be group-coded (int4_group > 0)
PackedExperts make_packed_experts_coded(int64_t n_experts, int64_t n, int64_t k, bool gated, const CodedFormat& f);

// One weight [n, k] in plain form: u U8 [n, k]; scale F32 [n, n_groups]; zero U8
// [n, n_groups] (zero-point form) or offset F32 [n, n_groups] (offset form), the other
// undefined.
struct CodedWeight {
  Tensor u, scale, zero, offset;
  // Super-block form instead of scale / offset: sb_d, sb_m F16 [n, n_superblocks];
  // sc I8 and mn U8 [n, n_groups] (sb_m and mn in the offset form only; sc and mn not
  // with one group per super-block).
  Tensor sb_d, sb_m, sc, mn;
};
// Packs expert e of p (make_packed_experts_coded) from w, checking every code, zero
// point, scale and offset (errors name the expert and the index in the whole expert).
// w holds rows [row0, row0 + w.u.dim(0)) of the expert: a loader packs a large weight
// a few rows at a time from a buffer that stays in cache (gguf_experts.cpp).
void pack_expert_coded(PackedExperts& p, int64_t e, const CodedWeight& w, int64_t row0 = 0);
// Expert e as stored; in the super-block form also its effective scale (and offset),
// D * sc and M * mn, as the GEMM uses them.
CodedWeight unpack_expert_coded(const PackedExperts& p, int64_t e);

}  // namespace moe
