// Weights stored as GGUF Q4_0 (the experts and most linears of llama.cpp's Q4_0 files)
// loaded into the W4A8 int4 format of kernels/grouped_gemm_int4.h without losing a bit.
//
// A Q4_0 block is 32 weights w = (q - 8) * d with q in [0, 15] and one f16 d. The int4
// format holds w = (u - z) * s per group of 32 with u, z in [0, 15] and s >= 0, so:
//   d >= 0:  u = q,       z = 8, s = d
//   d <  0:  u = 15 - q,  z = 7, s = -d     ((15 - q) - 7 = 8 - q; (8 - q) * -d = (q - 8) * d)
// Every product is exact (d has 11 significant bits, |q - 8| <= 8), so the weights the
// GEMM multiplies are ggml's dequantised values exactly; only the activations are
// quantised (int8 per token, as every W4A8 expert's are).
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "loader/shard.h"

namespace moe::gguf {

// True when `r` names a GGUF Q4_0 tensor of `ck`.
bool is_q4_0(const Checkpoint& ck, const TensorRead& r);

// Packs local expert e of w13 (gated: gate rows, then up rows) and w2 (made by
// make_packed_experts_int4 with groups of 32 and zero points) from the GGUF Q4_0 reads
// of its gate, up and down projections (this rank's slice of each: rows, or under
// MoE-TP column ranges that must start and end on a 32-weight block). Errors name the
// tensor: a non-finite d, or a slice that cuts a block.
void pack_q4_0_expert(const Checkpoint& ck, PackedExperts& w13, PackedExperts& w2, int64_t e, const TensorRead& gate,
                      const TensorRead& up, const TensorRead& down);

// Packs slot e of a non-gated int4 PackedExperts (groups of 32, zero points) from the
// GGUF Q4_0 read r: a linear layer's weight (attention projections, lm_head) held as
// stored. The same slicing rules and errors as above.
void pack_q4_0_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r);

}  // namespace moe::gguf
