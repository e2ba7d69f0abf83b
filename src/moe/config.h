// The MoE hyperparameters of a Hugging Face config.json, normalised across families.
//
// Field names differ per family (num_experts / n_routed_experts / num_local_experts /
// moe_num_experts, ...); this struct holds one meaning per field, and
// MoeConfig::from_hf is the single place that knows the spellings.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/routing.h"

namespace moe {

enum class Family { Qwen3Moe, Qwen2Moe, Mixtral, DeepseekV2, DeepseekV3, Ernie45Moe };

const char* family_name(Family f);
// The HF model_type strings we support, for error messages: "qwen3_moe, qwen2_moe, ...".
std::string supported_model_types();

struct MoeConfig {
  Family family = Family::Qwen3Moe;
  std::string model_type;
  int64_t hidden_size = 0;             // H
  int64_t n_layers = 0;                // num_hidden_layers
  // DeepSeek-V3 num_nextn_predict_layers: multi-token-prediction layers stored after the
  // decoder as "model.layers.{n_layers + i}.*". moe-ep does not run them: Model::load
  // skips them with a message, and the checks count their keys as known (not unexpected).
  int64_t n_mtp_layers = 0;
  int64_t moe_intermediate_size = 0;   // I of one routed expert
  int64_t dense_intermediate_size = 0;  // I of a dense-MLP layer (0: the family has none)
  int64_t n_experts = 0;               // E routed experts
  int64_t top_k = 0;                   // k experts per token
  Activation act = Activation::SiluMul;

  RoutingConfig routing;  // scoring, groups, bias, renormalisation, scaling

  // Shared experts: one dense gated MLP of this intermediate size (0: none).
  int64_t shared_intermediate_size = 0;
  bool shared_expert_gate = false;  // Qwen2-MoE: output scaled by sigmoid(x . w_gate)

  // Which decoder layers have a MoE block (the others have a dense MLP).
  std::vector<int64_t> mlp_only_layers;  // Qwen: listed layers are dense
  int64_t decoder_sparse_step = 1;       // Qwen: MoE where (layer + 1) % step == 0
  int64_t first_k_dense_replace = 0;     // DeepSeek: layers < this are dense
  int64_t moe_layer_freq = 1;            // DeepSeek: MoE where layer % freq == 0
  int64_t moe_layer_start_index = 0;     // ERNIE
  int64_t moe_layer_end_index = -1;      // ERNIE (-1: last layer)
  int64_t moe_layer_interval = 1;        // ERNIE: MoE where (layer + 1) % interval == 0

  static MoeConfig from_hf(const nlohmann::json& cfg);
  static MoeConfig from_file(const std::string& config_json_path);

  bool is_moe_layer(int64_t layer) const;
  // Throws naming the field if the values are inconsistent (k > E, groups not dividing E, ...).
  void validate() const;
  std::string summary() const;  // one line for logs and `inspect`
};

}  // namespace moe
