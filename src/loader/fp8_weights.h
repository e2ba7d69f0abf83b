// FP8 block-scaled expert weights (DeepSeek-V3's native checkpoints: F8_E4M3 weights,
// each with "<key>_scale_inv" f32 [n / block_n, k / block_k]) packed as e4m3 for the
// grouped GEMM, which dequantises them to bf16 panel by panel (kernels/grouped_gemm.h).
// Used when the compute dtype is bf16; with f32 compute the loader dequantises at load
// (load_fp8 in moe_weights.cpp), since the f32 kernels need f32 weights anyway.
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"

namespace moe {

// [block_n, block_k] from config.json's quantization_config.weight_block_size; DeepSeek-V3's
// [128, 128] when absent. Errors name the field when it is malformed or not positive.
std::pair<int64_t, int64_t> fp8_block_shape(const Checkpoint& ck);

// True when `key` is an F8_E4M3 tensor with its "_scale_inv" companion.
bool is_fp8_weight(const Checkpoint& ck, const std::string& key);

// Packed FP8 gated MLP weights for n experts of [2 I, H] (W13) and [H, I] (W2).
void make_fp8_mlp(const Checkpoint& ck, int64_t n_experts, int64_t I, int64_t H, PackedExperts& w13,
                  PackedExperts& w2);

// Packs slot e of w13 / w2 from the gate, up and down reads (their e4m3 codes and block
// scales). Errors name the tensor, its file and its scales. MoE-TP slices are refused.
void pack_fp8_expert(const Checkpoint& ck, const LayerRead& gate, const LayerRead& up, const LayerRead& down,
                     PackedExperts& w13, PackedExperts& w2, int64_t e);

}  // namespace moe
