// Hugging Face int4 checkpoints (GPTQ, AWQ, compressed-tensors pack-quantized) loaded
// into the W4A8 int4 format of kernels/grouped_gemm_int4.h without changing a value.
//
// Each format stores an nn.Linear "<m>" [out N, in K] as 4-bit codes q, an integer zero
// point z and a float scale s per group of input columns, w = s * (q - z): exactly the
// int4 format's (u - z) * scale, so codes and zero points are copied and the scale is
// widened to f32 (f16 / bf16 -> f32 is exact). Layouts, as the formats' own packages
// write them (tools/gen_hf_int4_fixtures.py checks ours against theirs):
//   GPTQ (GPTQModel / AutoGPTQ; quant_method "gptq")
//     <m>.qweight  i32 [K / 8, N]   nibble j (bits 4j..4j+3) of word [i, n] = q[n, 8i + j]
//     <m>.qzeros   i32 [G, N / 8]   nibble j of word [g, i] = z[8i + j, g]; checkpoint_format
//                                   "gptq" (v1) stores z - 1 word-wise: GPTQModel reads a
//                                   word as word + 0x11111111 (mod 2^32, carries included),
//                                   so do we; "gptq_v2" stores z
//     <m>.scales   f16 [G, N]       <m>.g_idx i32 [K]: the group of each input column
//                                   (optional; k / group_size when absent)
//   AWQ (AutoAWQ GEMM; quant_method "awq")
//     <m>.qweight  i32 [K, N / 8]   nibble j of word [k, i] = q[8i + order[j], k] with
//                                   order = {0, 2, 4, 6, 1, 3, 5, 7}
//     <m>.qzeros   i32 [G, N / 8]   the same order;  <m>.scales f16 [G, N]
//   compressed-tensors pack-quantized (quant_method "compressed-tensors")
//     <m>.weight_packed      i32 [N, ceil(K / 8)]  nibble j of word [n, i] = q[n, 8i + j] + 8
//                                                  (q signed, [-8, 7])
//     <m>.weight_scale       [N, G]
//     <m>.weight_zero_point  i32 [ceil(N / 8), G]  asymmetric only: nibble j of word [i, g]
//                                                  = zp[8i + j, g] + 8 (symmetric: zp = 0)
//     <m>.weight_shape       [2] = {N, K};  <m>.weight_g_idx [K] (optional, as g_idx)
// with G = ceil(K / group_size), 1 for group_size -1 / strategy "channel". In int4 terms:
// GPTQ and AWQ u = q, z as decoded; compressed-tensors u = q + 8, z = zp + 8. A negative
// scale (no packer writes one) is held exactly as u' = 15 - u, z' = 15 - z, s' = -s.
//
// Kernel groups: 128, 64 or 32, the largest that divides group_size (per-channel: 128;
// the same scale repeated, exact). A kernel group must lie in one file group: true for
// every g_idx that keeps groups contiguous (desc_act false, GPTQ static_groups, or no
// g_idx) and every TP slice that starts and ends on a kernel-group boundary. A true
// act-order g_idx (columns of one group scattered) needs each weight's input columns and
// its activations permuted: read_slice without an order is an error naming the tensor. A
// linear layer's act-order weight stays int4 with its input columns sorted by group and its
// activations gathered in the same order inside its GEMM (act_order, PackedExperts::in_perm);
// an expert's too (expert_act_order, its neurons reordered for down):
// the same products, summed in another order. Where no order makes the groups whole (a TP
// slice holding part of a group; gate and up in different orders) the loaders dequantise
// the weight exactly to the compute dtype instead.
//
// Every weight key the model loaders read ("<m>.weight") that the checkpoint lacks but
// whose module has <m>.qweight or <m>.weight_packed is such a weight (is_int4_weight).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "loader/shard.h"

namespace moe::hf_int4 {

// True when config.json's quantization_config is GPTQ, AWQ or compressed-tensors (a
// config that does not parse: false, the loaders report it where they read it).
bool checkpoint_int4(const Checkpoint& ck);

// True when `weight_key` ("<m>.weight") is absent and <m> is stored as int4.
bool is_int4_weight(const Checkpoint& ck, const std::string& weight_key);

// True for the keys the int4 formats store beside a module (".qweight", ".qzeros",
// ".scales", ".g_idx", ".weight_packed", ".weight_scale", ".weight_zero_point",
// ".weight_shape", ".weight_g_idx"); weight_key_of gives "<m>.weight" for them.
bool is_int4_key(const std::string& key);
std::string weight_key_of(const std::string& int4_key);
// The bytes the checkpoint stores for int4 weight "<m>.weight": codes, zero points,
// scales and group indices together (inspect's read plan counts a slice's share of them).
uint64_t stored_bytes(const Checkpoint& ck, const std::string& weight_key);

// The kernel group of the checkpoint's int4 weights (32, 64 or 128).
int64_t kernel_group(const Checkpoint& ck);

// Header checks of read r (r.key "<m>.weight", r.shape [N, K]): the config's method,
// every tensor present with its dtype and shape, the module not listed as unconverted.
// The message names the file, the tensor and what was expected.
std::optional<std::string> int4_problem(const Checkpoint& ck, const TensorRead& r);

// This rank's slice of read r: u U8 [n, k], zero U8 [n, ng], scale F32 [n, ng] with
// groups of kernel_group(ck). Errors name the file and tensor: a header problem, a
// non-finite scale, a g_idx out of range, a kernel group that spans two file groups.
struct Int4Slice {
  Tensor u, zero, scale;
};
// order (act_order's): the slice's columns in that order (local indices), kernel groups
// of one file group each, consecutive or not.
Int4Slice read_slice(const Checkpoint& ck, const TensorRead& r, const std::vector<int64_t>* order = nullptr);

// For a weight that is not int4_exact: an order of its slice's columns (a stable sort by
// g_idx group) in which every kernel group holds columns of one file group, so the
// weight is int4 once its input columns, and the activations it reads, are permuted so
// (PackedExperts::in_perm). Nothing when no order does (a slice holding part of
// a group whose size the kernel group does not divide).
std::optional<std::vector<int64_t>> act_order(const Checkpoint& ck, const TensorRead& r);

// True when read_slice can hold read r in int4: every kernel group of its slice is
// consecutive columns of one file group (false: a true act-order g_idx, or a TP slice
// that cuts a group). Reads g_idx only; header problems throw.
bool int4_exact(const Checkpoint& ck, const TensorRead& r);

// The slice's values s * (q - z) as f32 [n, k], each column with its own group (any
// g_idx, any slice; exact: the product of an f16 / bf16 scale and a 5-bit integer).
Tensor dequantize(const Checkpoint& ck, const TensorRead& r);

// An act-order expert (GPTQ desc_act) in int4: its gate and up projections' input columns
// in `hidden` (act_order's, which must be the same for both: GPTQ quantises them on the same
// inputs) and its intermediate neurons in `inter` (down's act_order). Nothing when some
// projection has no such order or gate and up differ (the loaders dequantise it then).
struct ExpertOrders {
  std::vector<int64_t> hidden;  // [H]: input column of each packed gate / up column
  std::vector<int64_t> inter;   // [I local]: neuron of each packed gate / up row and down column
};
std::optional<ExpertOrders> expert_act_order(const Checkpoint& ck, const TensorRead& gate, const TensorRead& up,
                                             const TensorRead& down);

// Packs local expert e of w13 (gate rows, then up rows) and w2 (int4, kernel_group(ck))
// from the reads of its gate, up and down projections. With orders (act-order): gate and up
// read their columns in orders->hidden, which goes to w13.in_perm[e] (allocated by the
// caller; grouped_gemm gathers the activations to match), and all three hold the
// intermediate neurons in orders->inter: gate's and up's rows and down's columns
// permuted alike, so the MLP computes the same products (its down sums in another order).
void pack_expert(const Checkpoint& ck, PackedExperts& w13, PackedExperts& w2, int64_t e, const TensorRead& gate,
                 const TensorRead& up, const TensorRead& down, const ExpertOrders* orders = nullptr);
// Packs slot e of a non-gated int4 PackedExperts from read r (a linear layer's weight).
void pack_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r);

}  // namespace moe::hf_int4
