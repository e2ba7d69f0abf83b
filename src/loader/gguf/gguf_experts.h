// Weights stored in GGUF's integer-coded types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K: the experts and most linears of llama.cpp's quantised files) loaded into the
// group-coded formats of kernels/grouped_gemm_int4.h without losing a bit.
//
// gguf::decompose_row splits a row into codes q in [0, 2^bits) and, per group of 16 or 32
// weights, an f32 scale and offset with w = scale * q - offset equal to ggml's
// dequantised value (gguf_types.h). The kernels hold exactly that:
//   4-bit types (Q4_0, Q4_1, Q4_K)        4-bit codes (W4A8's nibbles, half a byte each)
//   5- and 6-bit types (Q5_*, Q6_K)       6-bit codes (three quarters of a byte each)
//   8-bit type (Q8_0)                     8-bit codes, one byte each
//   symmetric types (Q4_0, Q5_0, Q8_0, Q6_K): zero points, w = (q - zero) * scale (the
//     same value: offset = zero * scale exactly, gguf_types.cpp), one per tensor (the
//     type's: 8, 16, 128, 32; a u8 per group where gate and up of two types share one);
//   the types with a min (Q4_1, Q5_1, Q4_K, Q5_K): f32 offsets per group.
// Every product is exact, so the weights the GEMM multiplies are ggml's dequantised
// values exactly; only the activations are quantised (int8 per token, as every W4A8 and
// W8A8 layer's are).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_int4.h"
#include "loader/checkpoint.h"
#include "loader/shard.h"

namespace moe::gguf {

// True when `r` names a GGUF tensor of an integer-coded type (the list above).
bool is_coded(const Checkpoint& ck, const TensorRead& r);

// The one format that holds all of `reads` (each is_coded): the finest group (16 when
// one is Q6_K), the widest codes one needs (4, 6 or 8 bits), offsets when one has a
// min, one zero point when all are symmetric with the same.
// (gate and up share a packed matrix, so they share its format.)
CodedFormat common_format(const Checkpoint& ck, const std::vector<const TensorRead*>& reads);

// Bytes a [n, k] weight takes in format f (codes, scales, zero points or offsets).
uint64_t coded_bytes(const CodedFormat& f, uint64_t n, uint64_t k);

// Packs local expert e of w13 (gated: gate rows, then up rows) and w2 (made by
// make_packed_experts_coded with common_format of {gate, up} and of {down}) from the
// GGUF reads of its gate, up and down projections (this rank's slice of each: rows, or
// under MoE-TP column ranges that must start and end on a group of the format). Errors
// name the tensor: a non-finite scale or min, or a slice that cuts a group.
void pack_expert(const Checkpoint& ck, PackedExperts& w13, PackedExperts& w2, int64_t e, const TensorRead& gate,
                 const TensorRead& up, const TensorRead& down);

// Packs slot e of a non-gated PackedExperts (common_format of {r}) from the read r: a
// linear layer's weight (attention projections, dense MLPs, lm_head) held as stored.
void pack_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r);

}  // namespace moe::gguf
