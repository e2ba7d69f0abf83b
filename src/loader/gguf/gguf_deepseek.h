// DeepSeek-V2/V3 (`deepseek2`) GGUF files as llama.cpp's converter writes them
// (convert_hf_to_gguf.py's DeepseekV2Model), for gguf_checkpoint.
//
// Config: MLA's ranks and head sizes from attention.{q_lora_rank, kv_lora_rank,
// key_length_mla, value_length_mla} and rope.dimension_count (files from before the MLA
// split carry the per-head sizes in key_length / value_length instead); the router from
// expert_gating_func (sigmoid: DeepSeek-V3's noaux_tc, whose selection bias is
// exp_probs_b; softmax: V2, group-limited when expert_group_count > 1),
// expert_weights_{scale,norm} and the group counts; YaRN's mscale_all_dim from
// rope.scaling.yarn_log_multiplier / 0.1 (GGUF keeps only that, so mscale is taken equal
// to it, as llama.cpp does).
//
// kv_b_proj: the converter splits each layer's kv_b_proj [heads x (nope + v), kv_lora]
// into attn_k_b [heads, kv_lora, nope] (each head's K rows, transposed) and attn_v_b
// [heads, v, kv_lora], for llama.cpp's absorbed MLA. Those are the very matrices the
// absorbed attention multiplies by (q_nope -> latent, latent -> v; model/attention.h), so
// gguf_checkpoint maps them as they are, in their own type, under
// self_attn.k_b_proj.weight [heads * kv_lora, nope] and self_attn.v_b_proj.weight
// [heads * v, kv_lora]: a quantised pair stays in its codes, nothing is composed or
// dequantised. Files that still hold attn_kv_b use it in place.
#pragma once

#include <nlohmann/json.hpp>

namespace moe::gguf {

class GgufModel;

// Adds the DeepSeek keys of config.json to c (which has the common ones) and sets its
// model_type / architectures to deepseek_v3 or deepseek_v2.
void deepseek2_config(const GgufModel& m, nlohmann::json& c);

// Checks every layer's attn_k_b / attn_v_b pair against the config: both present or
// neither, each of the shape above. Errors name the tensor and the shape expected.
void check_kv_b_halves(const GgufModel& m, const nlohmann::json& config);

}  // namespace moe::gguf
