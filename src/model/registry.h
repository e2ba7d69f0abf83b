// Model families, registered by Hugging Face model_type (llama.cpp's habit: one file
// per architecture, model/models/<family>.cpp, each with its hooks).
//
// Every supported family is a pre-norm decoder:
//   h = embed(ids); per layer: h += attn(rms(h)); h += mlp(rms(h)); logits = lm_head(rms(h))
// so a family differs only in its hyperparameters (hparams hook: attention kind,
// q/k norm, RoPE variant, MLA dims, softmax scale) and its tensor names (tensors hook).
// The MLP block (dense or MoE, routing rules) is described by MoeConfig.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

#include "core/json_brief.h"
#include "loader/checkpoint.h"
#include "model/attention.h"
#include "model/model_config.h"

namespace moe {

// Checkpoint keys outside the layers' attention (without ".weight").
struct ModelKeys {
  std::string embed = "model.embed_tokens";
  std::string final_norm = "model.norm";
  std::string lm_head = "lm_head";  // unused when embeddings are tied
  std::string input_norm(int64_t l) const { return layer(l) + ".input_layernorm"; }
  std::string post_attn_norm(int64_t l) const { return layer(l) + ".post_attention_layernorm"; }
  static std::string layer(int64_t l) { return "model.layers." + std::to_string(l); }
};

struct FamilyHooks {
  const char* model_type = "";
  // Fills the family-specific fields of c (read_common_hparams and MoeConfig are done).
  void (*hparams)(const nlohmann::json& cfg, ModelConfig& c) = nullptr;
  // The attention tensor names of layer `l`.
  AttentionKeys (*attention_keys)(const ModelConfig& c, int64_t l) = nullptr;
};

// The hooks of each family (model/models/*.cpp).
const FamilyHooks& qwen3_moe_hooks();
const FamilyHooks& qwen2_moe_hooks();
const FamilyHooks& mixtral_hooks();
const FamilyHooks& deepseek_v2_hooks();
const FamilyHooks& deepseek_v3_hooks();
const FamilyHooks& ernie4_5_moe_hooks();

// Throws naming the model_type and the supported ones.
const FamilyHooks& find_family(const std::string& model_type);
// The whole config: common fields, MoeConfig, the family's hparams; validated.
ModelConfig model_config_from_hf(const nlohmann::json& cfg);

// What config.json cannot say: the checkpoint's layout where a family has two
// (ModelConfig::int8_attention: FastDeploy's int8 fused qkv_proj in layer 0).
void apply_checkpoint_layout(const Checkpoint& ck, ModelConfig& c);

// Shared by the GQA families: model.layers.L.self_attn.{q,k,v,o}_proj, with a bias on
// q/k/v and on o as the family's module has them.
AttentionKeys gqa_attention_keys(int64_t l, bool qk_norm, bool qkv_bias = false, bool o_bias = false);

}  // namespace moe
