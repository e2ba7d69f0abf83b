// DeepSeek-V2 and -V3: multi-head latent attention (model/attention.h MlaAttention),
// RoPE on interleaved pairs of the rotary part (V2 always, as complex pairs; V3 when
// rope_interleave, the default), optional YaRN with the softmax scale multiplied by
// mscale(factor, mscale_all_dim)^2. MLP: dense below first_k_dense_replace; V2
// softmax with group_limited_greedy, V3 sigmoid with noaux_tc; shared experts.
#include <nlohmann/json.hpp>

#include <cmath>

#include "core/check.h"
#include "core/json_brief.h"
#include "model/registry.h"

namespace moe {
namespace {

int64_t get_dim(const nlohmann::json& cfg, const char* key, int64_t dflt) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return dflt;
  MOE_CHECK(it->is_number_integer(), "config.json: field '{}' is {}, expected an integer", key, json_brief(*it));
  return it->get<int64_t>();
}

void mla_hparams(const nlohmann::json& cfg, ModelConfig& c, bool interleave) {
  c.attention = AttentionKind::Mla;
  c.attention_bias = config_flag(cfg, "attention_bias", false);
  c.q_lora_rank = get_dim(cfg, "q_lora_rank", 0);
  c.kv_lora_rank = get_dim(cfg, "kv_lora_rank", 0);
  c.qk_nope_head_dim = get_dim(cfg, "qk_nope_head_dim", 0);
  c.qk_rope_head_dim = get_dim(cfg, "qk_rope_head_dim", 0);
  c.v_head_dim = get_dim(cfg, "v_head_dim", 0);
  c.rope.interleaved = interleave;
  // In double: the dims are not validated yet, and their int64 sum could overflow.
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim) + static_cast<double>(c.qk_rope_head_dim));
  if (c.rope.type != "default" && c.rope.mscale_all_dim != 0) {
    const double m = yarn_get_mscale(c.rope.factor, c.rope.mscale_all_dim);
    scale *= m * m;
  }
  c.attn_scale = scale;
}

void v2_hparams(const nlohmann::json& cfg, ModelConfig& c) { mla_hparams(cfg, c, true); }
void v3_hparams(const nlohmann::json& cfg, ModelConfig& c) {
  mla_hparams(cfg, c, config_flag(cfg, "rope_interleave", true));
}

AttentionKeys deepseek_keys(const ModelConfig& c, int64_t l) {
  const std::string p = ModelKeys::layer(l) + ".self_attn.";
  AttentionKeys k;
  k.layer = l;
  if (c.q_lora_rank > 0) {
    k.q_a = p + "q_a_proj";
    k.q_a_norm = p + "q_a_layernorm";
    k.q_b = p + "q_b_proj";
  } else {
    k.q = p + "q_proj";
  }
  k.kv_a = p + "kv_a_proj_with_mqa";
  k.kv_a_norm = p + "kv_a_layernorm";
  k.kv_b = p + "kv_b_proj";
  k.k_b = p + "k_b_proj";  // a GGUF's halves of kv_b_proj (ModelConfig::mla_split_kv_b)
  k.v_b = p + "v_b_proj";
  k.o = p + "o_proj";
  // attention_bias: the projections from the hidden state through q-LoRA / the latent,
  // and o_proj (q_proj, q_b_proj and kv_b_proj never have one).
  if (c.attention_bias) {
    if (c.q_lora_rank > 0) k.biased.push_back(k.q_a);
    k.biased.push_back(k.kv_a);
    k.biased.push_back(k.o);
  }
  return k;
}

}  // namespace

const FamilyHooks& deepseek_v2_hooks() {
  static const FamilyHooks h{"deepseek_v2", v2_hparams, deepseek_keys};
  return h;
}
const FamilyHooks& deepseek_v3_hooks() {
  static const FamilyHooks h{"deepseek_v3", v3_hparams, deepseek_keys};
  return h;
}

}  // namespace moe
