// Pieces shared by the single-rank and the expert-parallel benchmarks: layer
// shapes of public checkpoints, deterministic random weights (expert e's weights
// depend only on e, so any rank can rebuild any expert), and the output check.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "cli/bench_cmd.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The layer config for --shape (a preset or custom); softmax top-k with renormalisation.
MoeConfig bench_config(const BenchOptions& o);
std::string shape_names();  // "custom, qwen3-30b-a3b, ..."
bool is_shape(const std::string& name);

// Uniform [-scale, scale) values from a seed, as f32, rounded to `dtype` and back.
Tensor random_tensor(const Shape& shape, float scale, uint64_t seed, DType dtype = DType::F32);
// Routed expert e: W13 [2I, H] and W2 [H, I] in f32 holding `dtype`-exact values.
std::pair<Tensor, Tensor> expert_weights(const MoeConfig& cfg, int64_t e, DType dtype);
// "bf16,int8" -> {"bf16", "int8"}.
std::vector<std::string> dtype_list(const std::string& s);
// Router, shared experts and experts [begin, end) (their MoE-TP slice tp_rank of tp).
// dtype I8: the routed experts W8A8 (quantised from the f32 weights, smooth = 1), the
// shared experts bf16.
MoeLayerWeights random_layer(const MoeConfig& cfg, DType dtype, int64_t begin, int64_t end, int tp_rank = 0,
                             int tp = 1);

// Compares y [n, H] against moe_reference on x [n, H] (experts rebuilt from their
// seeds). Returns "ok (...)" or "FAILED (...)"; *ok tells which.
std::string check_sample(const MoeConfig& cfg, const MoeLayerWeights& w, const Tensor& x, const Tensor& y, DType dtype,
                         bool* ok);

}  // namespace moe::bench
