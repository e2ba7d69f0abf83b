// Pre-quantised W8A8 checkpoints: routed experts whose weights are already int8 in
// the file, loaded into I8 PackedExperts as they are (no requantisation). The format
// is detected per layer from the keys present; no flag is needed.
//
// xLLM SmoothQuant (per expert N, each of gate_proj / up_proj / down_proj, or Mixtral's
// w1 / w3 / w2; torch layout [out, in]):
//   experts.N.<proj>.qweight            int8 [out, in]
//   experts.N.<proj>.per_channel_scale  f32/bf16/f16 [out] or [out, 1]: w ~= q * scale
//   experts.N.<proj>.smooth             f32/bf16/f16 [in], optional (all experts or none)
// `smooth` is the multiplier xLLM's device kernels apply to the activation before the
// per-token quantisation (Ascend's dynamic-quant ops multiply x by `smooth_scales`):
// x_q = Q(x * smooth), the weight having been divided by it offline. The engine divides
// activations by its smooth vector (kernels/quant.h), so it holds 1 / smooth (f32).
// gate_proj and up_proj read the same input, so GEMM1 has one smooth vector per expert:
// up_proj's (the one xLLM loads), else gate_proj's; when both are stored they must be
// equal. Activations stay dynamic (per-token absmax).
//
// FastDeploy / ERNIE-4.5 static W8A8 (families whose scale table, loader/scales.h, has
// the FastDeploy names; Paddle layout [in, out]):
//   experts.N.up_gate_proj.weight         int8 [H, 2I] (gate columns, then up)
//   experts.N.up_gate_proj.weight_scale   f32/bf16/f16 [2I]
//   experts.N.down_proj.weight            int8 [I, H]
//   experts.N.down_proj.weight_scale      [H]
//   experts.up_gate_proj.activation_scale one scalar shared by all experts (or a copy
//                                         per expert, experts.N.up_gate_proj..., all equal)
//   experts.N.down_proj.activation_scale  one scalar per expert
// Paddle's quantisation tools store abs-max values, not steps: FastDeploy's MoE loaders
// turn activation_scale into in_scale = 1 / activation_scale and divide the weight
// scales by the integer range. So the engine's steps are value / 127 (f32 division,
// as the dynamic rule computes its scale): weights w ~= q * weight_scale / 127, and
// activations are quantised statically with s = activation_scale / 127,
// q = clamp(nearbyint(x / s), -127, 127) (kernels/quant.h quantize_row_q8_static).
//
// Every rank loads its own experts' weights and scales, plus what the dispatch sender
// needs for every expert: all GEMM1 smooth vectors (MoeLayerWeights::smooth_all) or the
// GEMM1 static scale (act_scale_all). The router is an ordinary float key.
//
// The rest of a FastDeploy W8A8 layer (ERNIE-4.5 W8A8 as FastDeploy stores it) uses the
// same conventions, each module one int8 Paddle [in, out] weight with an abs-max
// `weight_scale` [out] and one abs-max `activation_scale` for its input:
//   self_attn.qkv_proj     [H, (n_heads + 2 n_kv) hd]: q columns, then k, then v
//                          (FastDeploy's fused QKV; one activation scale for all three)
//   self_attn.o_proj       [n_heads hd, H]
//   mlp.up_gate_proj       [H, 2I] dense MLP layers (gate columns, then up), mlp.down_proj [I, H]
//   mlp.shared_experts.up_gate_proj / .down_proj   the shared experts, the same shapes
//   self_attn.cachek_matmul / cachev_matmul .activation_scale: the abs-max of the K / V
//                          that attention caches (after RoPE), one value or one per
//                          channel [n_kv hd]: the int8 KV cache's scales
//   self_attn.q_matmul / s_matmul .activation_scale: the static input scales of
//                          FastDeploy's int8 Q.K^T and S.V matmuls (see AttentionQuantScales)
// The activation scales are read through loader/scales.h load_layer_scales (FastDeploy's
// name map activation_scale -> in_scale -> act_scale); the weight scales beside their
// weights, sliced by the weight's TP rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/scales.h"
#include "loader/shard.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe {

enum class QuantFormat { None, SmoothQuant, StaticW8A8 };
const char* quant_format_name(QuantFormat f);  // "none", "xLLM SmoothQuant", "FastDeploy static W8A8"

// The format of `layer`'s routed experts, from the key names alone (no file is opened).
// A layer holding keys of both formats is an error naming one of each.
QuantFormat detect_quant_format(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer);

// True when `key` is an expert key of either format for `layer` (expert id < E), so
// unexpected_mlp_tensors accepts it.
bool is_quant_expert_key(const MoeConfig& cfg, const MlpKeys& keys, const std::string& key);

// Header checks (presence, dtype, shape) of experts [expert_begin, expert_end) of `layer`
// in format `f`, plus the keys every rank needs for all experts (GEMM1 smooth vectors,
// GEMM1 activation scale). Messages name the key, the layer, the file and both shapes.
std::vector<TensorProblem> check_quant_experts(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                               QuantFormat f, int64_t expert_begin, int64_t expert_end,
                                               size_t max_problems = SIZE_MAX);

// Loads this rank's experts ([opt.expert_begin, opt.expert_end), MoE-TP slice of I) into
// w.w13 / w.w2, which the caller allocated as I8 [E_l x 2I_l x H] / [E_l x H x I_l], and
// fills w.smooth_all / w.act_scale_all. Checks headers first (check_quant_experts),
// then values: scales and smooth vectors must be finite and > 0.
void load_quant_experts(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt,
                        QuantFormat f, MoeLayerWeights& w);

// ---- FastDeploy W8A8 linear layers outside the routed experts ------------------------

// True when "<prefix>.weight" is int8 in the checkpoint (headers only). Inline: the
// config readers use it (model/registry.cpp) and build without the loaders (fuzz/).
inline bool is_int8_weight(const Checkpoint& ck, const std::string& prefix) {
  const std::string key = prefix + ".weight";
  return ck.has(key) && ck.info(key).dtype == DType::I8;
}

// One int8 linear as this rank reads it.
struct Int8LinearRead {
  int64_t layer = -1;
  TensorRead weight;        // i8 [in, out]: column-parallel on dim 1 (with a window for one
                            // block of qkv_proj), row-parallel on dim 0, or replicated
  TensorRead weight_scale;  // [out]: the weight's column rule on dim 0; row-parallel: replicated
  std::string act_scale;    // the engine name of its input's activation scale (LayerScales)
};
// The read of "<prefix>" ([in, out], key relative to "model.layers.L.") for `split`
// (0 replicated, 1 column, 2 row) on rank `rank` of `size`; [out_begin, out_begin +
// out_len) of the output dim when out_len >= 0 (one block of a fused weight).
struct Int8LinearSpec {
  int64_t layer = 0;
  std::string module;  // "self_attn.qkv_proj", relative to the layer
  int64_t in = 0, out = 0;
  enum Split { Replicated, Column, Row } split = Replicated;
  int rank = 0, size = 1;
  int64_t out_begin = 0, out_len = -1;
};
Int8LinearRead int8_linear_read(const Int8LinearSpec& s);

// Checks the read's headers (present, i8 / float, shapes) and its activation scale in
// `scales` (present: an error names the checkpoint key; one value), then packs this
// rank's slice as 1 x I8 [out_l, in_l] with per-channel steps weight_scale / 127 and the
// static input step activation_scale / 127 (set_expert_act_scale). Values are checked
// finite and > 0. Errors name the key, the layer and the file.
PackedExperts load_int8_linear(const Checkpoint& ck, const MoeConfig& cfg, const Int8LinearRead& r,
                               const LayerScales& scales);

// The int8 gated MLP "model.layers.L.<block>" (block "mlp": a dense layer; "mlp.shared_experts"),
// intermediate size I, replicated: its up_gate_proj as the gated W13 (gate rows, then up
// rows) and its down_proj as W2, with their static activation scales.
bool is_int8_gated_mlp(const Checkpoint& ck, int64_t layer, const std::string& block);
GatedMlpWeights load_int8_gated_mlp(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const std::string& block,
                                    int64_t I);
// The reads of load_int8_gated_mlp: up_gate_proj weight and scale, down_proj weight and scale.
std::vector<TensorRead> int8_gated_mlp_reads(int64_t layer, const std::string& block, int64_t H, int64_t I);

// The attention's static scales beyond its linears (FastDeploy names, the seed 000):
//   cache_k / cache_v: steps (abs-max / 127) of the int8 KV cache, applied where K (after
//     RoPE) and V enter the cache: every cached value is quantised with the step,
//     q = clamp(nearbyint(x / step), -127, 127), and attention reads q * step
//     (FastDeploy's cache_k_quant_scale = 127 / abs-max, cache_k_out_scale = abs-max / 127).
//     moe-ep keeps the cache in f32, holding those dequantised values: the arithmetic
//     of an int8 cache, not its memory.
//   q_matmul / s_matmul: the static scales of FastDeploy's int8 Q.K^T (Q's) and S.V (the
//     softmax output's). The seed names them but does not define their arithmetic, and
//     moe-ep computes both products in f32: they are read and checked (finite, > 0, one
//     value), reported by `has_qs`, and not applied.
struct AttentionQuantScales {
  Tensor cache_k, cache_v;  // f32 [1] or [n_kv_l * hd] of this rank's kv heads; undefined: none
  bool has_qs = false;
  bool any() const { return cache_k.defined() || has_qs; }
};
// kv_dim = n_kv * hd (all ranks); this rank holds kv channels [rank*kv_dim/size, ...).
// Both cache scales or neither (an error names the missing one).
AttentionQuantScales load_attention_quant_scales(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                                 int64_t kv_dim, int rank, int size);

}  // namespace moe
