#include "model/registry.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/check.h"
#include "core/json_brief.h"
#include "loader/quant_weights.h"

namespace moe {

namespace {
const FamilyHooks* const* all_families() {
  static const FamilyHooks* const table[] = {&qwen3_moe_hooks(),   &qwen2_moe_hooks(),   &mixtral_hooks(),
                                             &deepseek_v2_hooks(), &deepseek_v3_hooks(), &ernie4_5_moe_hooks(),
                                             nullptr};
  return table;
}
}  // namespace

const FamilyHooks& find_family(const std::string& model_type) {
  std::string names;
  for (auto f = all_families(); *f; ++f) {
    if (model_type == (*f)->model_type) return **f;
    names += std::string(names.empty() ? "" : ", ") + (*f)->model_type;
  }
  MOE_FAIL("config.json: unsupported model_type '{}' (supported: {})", model_type, names);
}

ModelConfig model_config_from_hf(const nlohmann::json& cfg) {
  MOE_CHECK(cfg.is_object(), "config.json must be a JSON object");
  // json::value() would throw nlohmann's type_error for a model_type that is not a
  // string; MoeConfig::from_hf (next) names the field in that case.
  const auto mt = cfg.find("model_type");
  const FamilyHooks& fam = find_family(mt != cfg.end() && mt->is_string() ? mt->get<std::string>() : "");
  ModelConfig c;
  c.moe = MoeConfig::from_hf(cfg);
  read_common_hparams(cfg, c);
  c.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  fam.hparams(cfg, c);
  c.rope.dim = c.attention == AttentionKind::Mla ? c.qk_rope_head_dim : c.head_dim;
  c.validate();
  return c;
}

AttentionKeys gqa_attention_keys(int64_t l, bool qk_norm, bool qkv_bias, bool o_bias) {
  const std::string p = ModelKeys::layer(l) + ".self_attn.";
  AttentionKeys k;
  k.layer = l;
  k.q = p + "q_proj";
  k.k = p + "k_proj";
  k.v = p + "v_proj";
  k.o = p + "o_proj";
  if (qk_norm) {
    k.q_norm = p + "q_norm";
    k.k_norm = p + "k_norm";
  }
  if (qkv_bias) k.biased = {k.q, k.k, k.v};
  if (o_bias) k.biased.push_back(k.o);
  return k;
}

void apply_checkpoint_layout(const Checkpoint& ck, ModelConfig& c) {
  const AttentionKeys k = find_family(c.model_type).attention_keys(c, 0);
  c.int8_attention = !k.qkv.empty() && is_int8_weight(ck, k.qkv);
  c.mla_split_kv_b = c.attention == AttentionKind::Mla && !k.k_b.empty() && ck.has(k.k_b + ".weight");
}

}  // namespace moe
