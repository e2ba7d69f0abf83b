// Quantisation scale names: one mapping table per family, and a loader that returns
// a layer's scales in the engine's names, padded for vector loads.
//
// Each entry maps a checkpoint key (relative to "model.layers.{L}.", "{e}" = expert
// id) through the FastDeploy intermediate name (its checkpoint_to_fd_key_fn: the
// checkpoint's `activation_scale` is `in_scale` there) to the engine parameter. The
// ERNIE table follows FastDeploy's convention:
//   self_attn.{qkv,o}_proj.activation_scale -> .in_scale -> self_attn.{qkv,o}_proj.act_scale
//   self_attn.cache{k,v}_matmul / q_matmul / s_matmul .activation_scale
//                              -> .in_scale -> self_attn.attn.{cache_k,cache_v,q,s}_scale
//   mlp[.shared_experts].{up_gate,down}_proj.activation_scale -> .in_scale -> .act_scale
//   mlp.experts.up_gate_proj.activation_scale (one, shared by all experts)
//                              -> .in_scale -> mlp.experts.up_gate_proj_in_scale
//   mlp.experts.{e}.down_proj.activation_scale (one per expert)
//                              -> .in_scale -> mlp.experts.down_proj_in_scale [E_l]
//   *.weight_scale -> *.weight_scale (experts: stacked per local expert)
// The Hugging Face families (FP8 checkpoints) use `input_scale`, `weight_scale` and
// `weight_scale_inv` on every linear module; they map to act_scale / weight_scale /
// weight_scale_inv (experts stacked the same way).
//
// Padding: kernels read scale vectors with 128-byte (0x80) vector loads (two cache
// lines, an HPU/AVX-512 friendly unit), so every scale tensor's last dim is padded
// with zeros to a multiple of 128 bytes (32 f32), and each row starts 128-byte aligned.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "loader/checkpoint.h"
#include "moe/config.h"

namespace moe {

inline constexpr size_t kScaleAlignBytes = 0x80;

enum class ScaleKind { Activation, Weight };
enum class ScaleScope {
  Layer,            // one tensor per layer (attention, dense MLP, shared experts)
  SharedByExperts,  // one tensor for all routed experts of the layer
  PerExpert,        // one per routed expert; stacked over this rank's experts
};

struct ScaleMapEntry {
  std::string checkpoint;  // relative to "model.layers.{L}."; "{e}" marks the expert id
  std::string fd_name;     // FastDeploy's intermediate name (same placeholders)
  std::string engine;      // engine parameter name (relative to the layer)
  ScaleKind kind = ScaleKind::Activation;
  ScaleScope scope = ScaleScope::Layer;
};

// The table of a family (built once; stable references).
const std::vector<ScaleMapEntry>& scale_map(Family f);

struct ScaleMatch {
  const ScaleMapEntry* entry = nullptr;
  int64_t layer = -1;
  int64_t expert = -1;  // PerExpert entries only
  std::string fd_key;   // "model.layers.3.mlp.experts.5.down_proj.in_scale"
  std::string engine;   // "mlp.experts.down_proj_in_scale"
};
// The entry a checkpoint key matches, if any.
std::optional<ScaleMatch> match_scale_key(Family f, const std::string& key);

struct ScaleTensor {
  Tensor data;        // f32, last dim padded with zeros to a multiple of 32 elements
  Shape valid_shape;  // the logical shape ([E_l] or [E_l, N] for per-expert scales)
  std::string key;    // the checkpoint key it came from (the first one, for stacked scales)
  int64_t numel() const;  // of valid_shape
  // Value i of the valid part, in row-major order of valid_shape.
  float at(int64_t i) const;
};

struct LayerScales {
  std::map<std::string, ScaleTensor> tensors;  // engine name -> scale
  bool empty() const { return tensors.empty(); }
  const ScaleTensor* find(const std::string& engine) const;
};

struct ScaleLoad {
  int64_t layer = 0;
  int64_t expert_begin = 0, expert_end = -1;  // routed experts read (expert_end < 0: all)
  // Only ScaleKind::Activation entries: the model's int8 loaders read weight scales
  // beside their weights, sliced by the same TP rule (loader/quant_weights.h).
  bool activations_only = false;
};

// Loads every scale of `layer` the family's table knows, reading only the routed
// experts [expert_begin, expert_end). Per-expert scales are stacked in local expert
// order and must exist for every one of those experts. A shared up_gate activation
// scale may be stored once (the FastDeploy key) or per expert, in which case all the
// copies read must be equal. Every value must be finite, activation scales > 0 (a step
// of 0 or a NaN would quantise every input to one code), weight abs-max values >= 0: an
// error names the key, the file, the index.
// The model's loaders read their static activation scales through this
// (loader/quant_weights.h): the attention's, the dense MLPs', the shared experts' and
// the routed experts'.
LayerScales load_layer_scales(const Checkpoint& ck, const MoeConfig& cfg, const ScaleLoad& what);
LayerScales load_layer_scales(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, int64_t expert_begin = 0,
                              int64_t expert_end = -1);

// A copy of `v` (any float dtype, any shape; 0-D counts as [1]) as f32 with the last
// dim padded to kScaleAlignBytes.
ScaleTensor pad_scale(const Tensor& v);

}  // namespace moe
