// Qwen2-MoE: GQA with q/k/v biases (no o_proj bias), rotate_half RoPE, head_dim =
// hidden / heads. MLP: softmax top-k (renormalised only with norm_topk_prob), a
// shared expert scaled by sigmoid(shared_expert_gate . x).
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/registry.h"

namespace moe {
namespace {

void hparams(const nlohmann::json& cfg, ModelConfig& c) {
  c.attention = AttentionKind::Gqa;
  c.rope.interleaved = false;
  MOE_CHECK(!cfg.value("use_sliding_window", false), "config.json: use_sliding_window=true is not supported");
}

// The q/k/v biases are loaded because the checkpoint has them (qkv_bias).
AttentionKeys keys(const ModelConfig&, int64_t l) { return gqa_attention_keys(l, false); }

}  // namespace

const FamilyHooks& qwen2_moe_hooks() {
  static const FamilyHooks h{"qwen2_moe", hparams, keys};
  return h;
}

}  // namespace moe
