// Mixtral: GQA without biases, rotate_half RoPE (interleaved pairs for a GGUF's config). MLP: every layer is MoE, softmax
// top-k always renormalised; experts under block_sparse_moe (Hub) or mlp (fused).
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/registry.h"

namespace moe {
namespace {

void mixtral_hparams(const nlohmann::json& cfg, ModelConfig& c) {
  c.attention = AttentionKind::Gqa;
  // rope_interleave (DeepSeek-V3's key; Mixtral's own checkpoints never set it): q and k
  // rows in interleaved-pair order, as a Mixtral GGUF holds them (loader/gguf/
  // gguf_checkpoint.h writes it into the config it makes).
  c.rope.interleaved = config_flag(cfg, "rope_interleave", false);
  // A sliding window changes nothing while every sequence is shorter than it; the
  // runner refuses longer sequences (ModelConfig::sliding_window).
  if (auto it = cfg.find("sliding_window"); it != cfg.end() && it->is_number_integer() && it->get<int64_t>() > 0)
    c.sliding_window = it->get<int64_t>();
}

AttentionKeys mixtral_keys(const ModelConfig&, int64_t l) { return gqa_attention_keys(l, false); }

}  // namespace

const FamilyHooks& mixtral_hooks() {
  static const FamilyHooks h{"mixtral", mixtral_hparams, mixtral_keys};
  return h;
}

}  // namespace moe
