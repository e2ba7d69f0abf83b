// Loads the MLP block of one decoder layer (MoE or dense) from a Hugging Face
// checkpoint into packed engine weights.
//
// One name map per family (checkpoint key -> engine parameter). Two expert
// layouts are read: per-expert keys as on the Hub (`experts.N.gate_proj.weight`,
// Mixtral `experts.N.w1/w3/w2`) and stacked experts as newer transformers write
// them (`experts.gate_up_proj` [E, 2I, H], gate rows first; `experts.down_proj`
// [E, H, I]). Only the experts in [expert_begin, expert_end) are touched: every
// tensor goes through load_sharded with its ShardRule (loader/shard.h), so a rank
// reads only its experts' byte ranges (stacked tensors: their rows) and, under
// MoE-TP, only its I slice of gate/up and of down (the latter row by row).
// Every tensor of the block is checked (present, shape, dtype) before anything is
// allocated, so a hostile config cannot make the loader allocate what the file
// does not hold.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/progress.h"
#include "loader/shard.h"
#include "loader/weights_cache/weights_cache.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe {

struct MlpLoadOptions {
  DType compute = DType::F32;  // packed weight dtype: F32 or BF16
  // --quantize w8a8: the routed experts become W8A8 int8 (per-output-channel scales
  // absmax / 127 computed at load, smooth = 1); the router and shared experts stay in
  // `compute`.
  bool quantize_w8a8 = false;
  // --quantize w4a8: the routed experts become W4A8 (kernels/grouped_gemm_int4.h): 4-bit
  // weights with one scale and zero point per int4_group (32, 64 or 128) k values of each
  // output column, computed at load; activations as W8A8's. Float checkpoints only.
  // Default group 32: this quantiser rounds to nearest without calibration, and on
  // heavy-tailed weights g = 128 doubles the layer's error (1 - cosine) against g = 32
  // (docs/PERF_QUANT.md) for 18% fewer bytes.
  bool quantize_w4a8 = false;
  int64_t int4_group = 32;
  // Routed experts stored as GGUF Q4_0 load into W4A8 with groups of 32, exactly
  // (loader/gguf/gguf_experts.h), unless another form is asked for (--quantize w8a8, or
  // w4a8 with groups of 64 or 128: dequantised, then quantised again). false: they are
  // dequantised to `compute` like any float weight (f32 holds them exactly). The same
  // flag keeps GPTQ / AWQ / compressed-tensors int4 weights (loader/hf_int4/hf_int4.h) in
  // int4 with the checkpoint's groups (32, 64 or 128; w8a8, or w4a8 with another group:
  // dequantised exactly, then quantised again); false: dequantised exactly to `compute`.
  bool gguf_q4_0_as_int4 = true;
  int64_t expert_begin = 0;    // routed experts to load: [begin, end)
  int64_t expert_end = -1;     // -1: all experts
  // MoE-TP: this rank holds intermediate rows [tp_rank*I/tp, (tp_rank+1)*I/tp) of
  // every routed expert (gate and up rows, down columns). I must divide by tp.
  int tp_rank = 0;
  int tp_size = 1;
  // Attention TP over the EP group (--attn-tp): the shared experts of a MoE layer and a
  // dense MLP layer hold intermediate rows [r*I/n, (r+1)*I/n) (gate/up column-parallel,
  // down row-parallel) on rank r of n, and the caller sums their partial outputs over
  // the group (the MoE layer's one all-reduce). Only with tp_size 1: MoE-TP keeps them
  // whole (the replicated whitelist, loader/shard.h).
  int mlp_tp_rank = 0;
  int mlp_tp_size = 1;
  // Unexpected tensors under the layer's MLP block (keys the family's map does not
  // use): a warning through `warn` (default: stderr), or an error when strict.
  bool strict = false;
  std::function<void(const std::string&)> warn;
  Progress* progress = nullptr;  // advanced by the bytes of each expert read (may be null)
  // --weights-cache: the block comes from the cache when it holds a valid record of it,
  // and is recorded there when it is packed (loader/weights_cache/weights_cache.h). Null:
  // no cache.
  WeightsCache* cache = nullptr;
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

// `key` against a pattern with one "{}" for a decimal expert id (no leading zeros, at
// most 12 digits), e.g. "model.layers.7.mlp.experts.12.w1.weight" against
// "...experts.{}.w1.weight": true and *id = 12.
bool match_expert_key(const std::string& pattern, const std::string& key, int64_t* id);

// One tensor the loader reads for a layer, with the rule that slices it.
struct LayerRead {
  std::string key;
  Shape full_shape;
  ShardRule rule;
  int rank = 0, size = 1;  // the group the rule slices over (MoE-TP for experts)
  enum Role { Router, Bias, ExpertGate, ExpertUp, ExpertDown, FusedGateUp, FusedDown, Shared, SharedGate, Dense } role;
  int64_t expert = -1;  // per-expert keys: the global expert id
  // A FastDeploy int8 weight (Paddle [in, out]) of a dense MLP or the shared experts, or
  // its weight_scale: read by loader/quant_weights.h load_int8_gated_mlp.
  bool int8 = false;
  TensorRead tensor_read() const { return {key, full_shape, rule, rank, size}; }
};
// Every tensor load_moe_layer / load_dense_mlp reads for `layer` with `opt`, in the
// order it reads them; checks nothing. With per_expert vs fused chosen as the loader
// does (from which keys the checkpoint has). The shared experts get the tensor-parallel
// rules of a dense MLP over the MoE-TP group (gate/up column, down row) passed through
// the replicated whitelist (loader/shard.h moe_replicated_whitelist), which keeps them
// whole: the MoE block runs them sequence-parallel. The dense MLP layers are replicated
// (Model::mlp runs them whole on every rank, with no TP all-reduce after them). Under
// mlp_tp_size > 1 both are split over that group instead (see MlpLoadOptions).
std::vector<LayerRead> mlp_layer_reads(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                       const MlpLoadOptions& opt);
// Bytes the loader reads for those reads (loader/shard.h read_bytes).
uint64_t mlp_layer_read_bytes(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt);

// A problem with one tensor of a layer's MLP block.
struct TensorProblem {
  enum Kind { Missing, WrongShape, WrongDType, Unexpected } kind;
  std::string key;
  std::string message;  // names the key, the layer, the file and both shapes
};
// The problem with tensor `key`, if any (headers only): missing, another shape than
// `expected`, or a dtype the loaders cannot read (f32, bf16, f16; f8_e4m3 with its
// block scales "<key>_scale_inv" when `fp8_ok`; int4 tensors in place of a missing key,
// loader/hf_int4/hf_int4.h int4_problem). Messages name the key, the layer (when
// >= 0), the file and both shapes.
std::optional<TensorProblem> tensor_problem(const Checkpoint& ck, const std::string& key, const Shape& expected,
                                            int64_t layer, bool fp8_ok = true);
// Checks presence, shape and dtype of every tensor the loader would read for `layer`
// (all experts), stopping after `max_problems`. Reads headers only.
std::vector<TensorProblem> check_mlp_block(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                           size_t max_problems = SIZE_MAX);
// The key prefixes of layer `layer`'s MLP block: "model.layers.L.mlp." and, for
// Mixtral on the Hub, "model.layers.L.block_sparse_moe.".
std::vector<std::string> mlp_block_prefixes(int64_t layer);
// Keys under the layer's MLP block (mlp_block_prefixes) that the family's name map
// (weights and scales) does not use.
std::vector<std::string> unexpected_mlp_tensors(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer);

MoeLayerWeights load_moe_layer(const Checkpoint& ckpt, const MoeConfig& cfg, int64_t layer,
                               const MlpLoadOptions& opt);
GatedMlpWeights load_dense_mlp(const Checkpoint& ckpt, const MoeConfig& cfg, int64_t layer, DType compute);
GatedMlpWeights load_dense_mlp(const Checkpoint& ckpt, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt);

}  // namespace moe
