// The whole-model hyperparameters of a Hugging Face config.json: everything a
// decoder needs beyond the MoE block (moe::MoeConfig holds that part).
//
// Field spellings differ per family; each family file (model/models/*.cpp) fills
// this struct in its hparams hook, starting from read_common_hparams().
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config.h"

namespace moe {

enum class AttentionKind : uint8_t { Gqa, Mla };

// Rotary position embedding, per HF modeling_rope_utils ("default" and "yarn").
struct RopeConfig {
  double theta = 10000.0;
  int64_t dim = 0;           // rotated dims per head (head_dim, or qk_rope_head_dim for MLA)
  bool interleaved = false;  // pairs (2i, 2i+1) rotate together (ERNIE, DeepSeek); else rotate_half
  std::string type = "default";  // "default" or "yarn"
  // YaRN only (rope_type "yarn"):
  double factor = 1.0;
  double attention_factor = 0.0;  // 0: derived from factor, mscale, mscale_all_dim
  double mscale = 0.0, mscale_all_dim = 0.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_position = 0;
  bool truncate = true;
};

struct ModelConfig {
  MoeConfig moe;  // MLP blocks: experts, routing, which layers are MoE
  std::string model_type;
  AttentionKind attention = AttentionKind::Gqa;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // GQA head size (may differ from hidden / heads)
  double rms_eps = 1e-6;
  int64_t max_position = 0;  // max_position_embeddings (informational)
  bool tie_embeddings = false;
  bool qk_norm = false;  // Qwen3: per-head RMSNorm on q and k before RoPE
  // The family's attention-bias flag (Qwen2-MoE qkv_bias, Qwen3-MoE and DeepSeek
  // attention_bias); which projections it gives a bias is the family's keys hook.
  bool attention_bias = false;
  int64_t sliding_window = 0;  // Mixtral: > 0 limits attention; sequences must stay within it
  // FastDeploy W8A8 (ERNIE-4.5): the attention is one int8 fused qkv_proj [in, out] and an
  // int8 o_proj, with static scales (loader/quant_weights.h). From the checkpoint's
  // keys, not config.json: apply_checkpoint_layout (model/registry.h).
  bool int8_attention = false;
  // MLA with kv_b_proj held as its two halves, k_b_proj and v_b_proj (a GGUF's attn_k_b /
  // attn_v_b, which may be quantised: model/attention.h). From the checkpoint's keys.
  bool mla_split_kv_b = false;

  // MLA (DeepSeek): see model/mla.h.
  int64_t q_lora_rank = 0;  // 0: plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  RopeConfig rope;
  double attn_scale = 0;  // softmax scale (1/sqrt(d), times YaRN mscale^2 for MLA)
  std::vector<int64_t> eos_token_ids;  // config.json / generation_config.json

  void validate() const;
  std::string summary() const;
};

// Fields every family spells the same way (vocab, hidden, layers, heads, eps, tie,
// rope parameters from "rope_parameters" or the older "rope_scaling" + "rope_theta").
void read_common_hparams(const nlohmann::json& cfg, ModelConfig& c);
// YaRN helpers (HF semantics), exposed for tests.
double yarn_get_mscale(double scale, double mscale);
// inv_freq[i], i < dim/2, computed in f32 as HF does; and the cos/sin multiplier.
std::vector<float> rope_inv_freq(const RopeConfig& r, double* attention_factor);

}  // namespace moe
