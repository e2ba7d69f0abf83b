// ERNIE-4.5-MoE: GQA, RoPE on interleaved pairs (2i, 2i+1), embeddings usually tied
// to lm_head. MLP: softmax with a selection-only bias (moe_statics), renormalised
// with a clamp; dense layers outside [moe_layer_start_index, moe_layer_end_index].
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/registry.h"

namespace moe {
namespace {

void ernie_hparams(const nlohmann::json& cfg, ModelConfig& c) {
  c.attention = AttentionKind::Gqa;
  c.rope.interleaved = true;
  MOE_CHECK(!config_flag(cfg, "use_bias", false), "config.json: use_bias=true is not supported for ernie4_5_moe");
}

// Hugging Face's separate q/k/v, or FastDeploy's fused qkv_proj (its W8A8 checkpoints):
// attention_reads picks the latter when ModelConfig::int8_attention.
AttentionKeys ernie_keys(const ModelConfig&, int64_t l) {
  AttentionKeys k = gqa_attention_keys(l, false);
  k.qkv = ModelKeys::layer(l) + ".self_attn.qkv_proj";
  return k;
}

}  // namespace

const FamilyHooks& ernie4_5_moe_hooks() {
  static const FamilyHooks h{"ernie4_5_moe", ernie_hparams, ernie_keys};
  return h;
}

}  // namespace moe
