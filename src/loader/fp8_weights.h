// FP8 block-scaled weights as DeepSeek-V3/R1 and Qwen3-*-FP8 publish them: an F8_E4M3
// tensor "<key>" [n, k] (or stacked experts [E, n, k]) with "<key>_scale_inv", f32 or
// bf16 [ceil(n / block_n), ceil(k / block_k)] (stacked: [E, ...]): element [i, j] means
// e4m3(w[i, j]) * scale_inv[i / block_n, j / block_k] (an f32 product). The block shape
// comes from quantization_config.weight_block_size (loader/quant_config.h); the edge
// blocks of a dimension the block does not divide are partial, as the releases'
// quantisers write them.
//
// A rank's slice (load_fp8_slice) holds its codes as they are and, per row, the scale of
// each block of `block_k` of its columns. Rows carry their own scale, so a TP slice may
// cut a block of rows anywhere (column-parallel q/k/v, MoE-TP's I slice of gate/up, a
// fused gate_up whose gate and up share a block). Columns keep blocks: block_k is the
// widest even width that divides the slice's k and never straddles a checkpoint block
// (the checkpoint's own width when the slice starts on a block boundary; a narrower one
// when a row-parallel slice starts inside a block). It must be even because the GEMM's
// k pairs share one scale; an odd one is an error naming the tensor and the block.
//
// With bf16 compute the codes stay e4m3 in memory and the grouped GEMM dequantises them
// panel by panel (kernels/grouped_gemm.h), rounding each value to bf16; with f32
// compute the loaders dequantise at load, exactly (the f32 product, as transformers
// computes with the dequantised weights).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "loader/quant_config.h"
#include "loader/shard.h"

namespace moe {

// [block_n, block_k] from quantization_config.weight_block_size; [128, 128] when absent.
std::pair<int64_t, int64_t> fp8_block_shape(const Checkpoint& ck);

// True when `key` is an F8_E4M3 tensor (block-scaled or not: fp8_problem says if it is usable).
bool is_fp8_weight(const Checkpoint& ck, const std::string& key);

// Header checks of the F8_E4M3 tensor r.key (r.shape its full shape): "<key>_scale_inv"
// present, f32/bf16/f16, of shape [.., ceil(n / bn), ceil(k / bk)]; its module not listed
// in modules_to_not_convert / ignored_layers; this rank's slice gives an even block_k.
// The message names the tensor, its file and what was expected.
std::optional<std::string> fp8_problem(const Checkpoint& ck, const TensorRead& r);

struct Fp8Slice {
  Tensor codes;          // f8e4m3 [n, k] or stacked [E_l, n, k]: this rank's codes
  Tensor row_scale;      // f32 [n, k / block_k] (stacked: [E_l, n, k / block_k])
  int64_t block_k = 0;   // even, divides k
  std::string key;       // for messages
  int64_t rows() const { return codes.dim(codes.ndim() - 2); }
  int64_t cols() const { return codes.dim(codes.ndim() - 1); }
};

// The block_k load_fp8_slice(r) will use (headers only; throws like fp8_problem).
int64_t fp8_slice_block_k(const Checkpoint& ck, const TensorRead& r);
// This rank's slice of an FP8 tensor; checks fp8_problem, then the scale values (finite,
// within the range pack_expert_fp8 accepts); NaN codes are caught where the codes are used
// (dequantize_fp8 and pack_expert_fp8), so each code is checked once.
Fp8Slice load_fp8_slice(const Checkpoint& ck, const TensorRead& r);
// The slice's values in `out` (F32: the exact f32 products; BF16: each rounded to
// nearest even, the values the FP8 GEMM computes with), shaped like the codes.
Tensor dequantize_fp8(const Fp8Slice& s, DType out);

// Allocates n_experts FP8 [n, k] matrices for slices with this block_k.
PackedExperts make_packed_fp8(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t block_k);
// Packs slot e from one slice (expert `in_slice` of a stacked slice, or -1 for a 2-D one).
void pack_fp8(PackedExperts& p, int64_t e, const Fp8Slice& s, int64_t in_slice = -1);
// Packs gated slot e from gate rows then up rows (2-D slices with the same k and block_k).
void pack_fp8_gated(PackedExperts& p, int64_t e, const Fp8Slice& gate, const Fp8Slice& up);

}  // namespace moe
