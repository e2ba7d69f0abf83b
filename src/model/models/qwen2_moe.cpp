// Qwen2-MoE: GQA with q/k/v biases (no o_proj bias), rotate_half RoPE, head_dim =
// hidden / heads. MLP: softmax top-k (renormalised only with norm_topk_prob), a
// shared expert scaled by sigmoid(shared_expert_gate . x).
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/registry.h"

namespace moe {
namespace {

void qwen2_hparams(const nlohmann::json& cfg, ModelConfig& c) {
  c.attention = AttentionKind::Gqa;
  c.attention_bias = config_flag(cfg, "qkv_bias", true);  // transformers' default: Qwen2 always had them
  c.rope.interleaved = false;
  MOE_CHECK(!config_flag(cfg, "use_sliding_window", false), "config.json: use_sliding_window=true is not supported");
}

// q/k/v have a bias (qkv_bias), o_proj never.
AttentionKeys qwen2_keys(const ModelConfig& c, int64_t l) { return gqa_attention_keys(l, false, c.attention_bias, false); }

}  // namespace

const FamilyHooks& qwen2_moe_hooks() {
  static const FamilyHooks h{"qwen2_moe", qwen2_hparams, qwen2_keys};
  return h;
}

}  // namespace moe
