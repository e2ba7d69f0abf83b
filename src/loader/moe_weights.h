// Loads the MLP block of one decoder layer (MoE or dense) from a Hugging Face
// checkpoint into packed engine weights.
//
// One name map per family (checkpoint key -> engine parameter). Two expert
// layouts are read: per-expert keys as on the Hub (`experts.N.gate_proj.weight`,
// Mixtral `experts.N.w1/w3/w2`) and stacked experts as newer transformers write
// them (`experts.gate_up_proj` [E, 2I, H], gate rows first; `experts.down_proj`
// [E, H, I]). Only the experts in [expert_begin, expert_end) are touched.
#pragma once

#include <cstdint>
#include <string>

#include "loader/checkpoint.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe {

struct MlpLoadOptions {
  DType compute = DType::F32;  // packed weight dtype: F32 or BF16
  int64_t expert_begin = 0;    // routed experts to load: [begin, end)
  int64_t expert_end = -1;     // -1: all experts
  // MoE-TP: this rank holds intermediate rows [tp_rank*I/tp, (tp_rank+1)*I/tp) of
  // every routed expert (gate and up rows, down columns). I must divide by tp.
  int tp_rank = 0;
  int tp_size = 1;
};

// The checkpoint key names of one layer's MLP block.
struct MlpKeys {
  std::string block;  // "model.layers.3.mlp" (Mixtral: "model.layers.3.block_sparse_moe")
  std::string router;            // [E, H]
  std::string correction_bias;   // [E] or [1, E]; empty if the family has none
  std::string expert_gate, expert_up, expert_down;  // with "{}" for the expert id
  std::string fused_gate_up, fused_down;            // stacked layout
  std::string shared_prefix;     // "...shared_expert" / "...shared_experts"; empty: none
  std::string shared_gate;       // Qwen2-MoE shared_expert_gate.weight [1, H]
  std::string dense_prefix;      // dense-MLP layer: "{prefix}.gate_proj.weight" ...
};
// With a checkpoint, picks the spelling that checkpoint uses where a family has two.
MlpKeys mlp_keys(const MoeConfig& cfg, int64_t layer, const Checkpoint* ck = nullptr);

MoeLayerWeights load_moe_layer(const Checkpoint& ckpt, const MoeConfig& cfg, int64_t layer,
                               const MlpLoadOptions& opt);
GatedMlpWeights load_dense_mlp(const Checkpoint& ckpt, const MoeConfig& cfg, int64_t layer, DType compute);

}  // namespace moe
