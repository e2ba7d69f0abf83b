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
// GEMM1 static scale (act_scale_all). Router and shared experts are ordinary float keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
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

}  // namespace moe
