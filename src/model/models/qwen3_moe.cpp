// Qwen3-MoE: GQA with per-head RMSNorm on q and k (before RoPE), rotate_half RoPE,
// optional attention bias, explicit head_dim (may differ from hidden / heads).
// MLP: softmax top-k routing with norm_topk_prob; dense layers in mlp_only_layers.
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/registry.h"

namespace moe {
namespace {

void qwen3_hparams(const nlohmann::json& cfg, ModelConfig& c) {
  c.attention = AttentionKind::Gqa;
  c.qk_norm = true;
  c.attention_bias = config_flag(cfg, "attention_bias", false);
  c.rope.interleaved = false;
  MOE_CHECK(!config_flag(cfg, "use_sliding_window", false), "config.json: use_sliding_window=true is not supported");
}

// attention_bias gives all four projections a bias.
AttentionKeys qwen3_keys(const ModelConfig& c, int64_t l) {
  return gqa_attention_keys(l, true, c.attention_bias, c.attention_bias);
}

}  // namespace

const FamilyHooks& qwen3_moe_hooks() {
  static const FamilyHooks h{"qwen3_moe", qwen3_hparams, qwen3_keys};
  return h;
}

}  // namespace moe
