// Pieces shared by the single-rank and the expert-parallel benchmarks: layer
// shapes of public checkpoints, deterministic random weights (expert e's weights
// depend only on e, so any rank can rebuild any expert), and the output check.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/bench_cmd.h"
#include "comm/communicator.h"
#include "core/clock.h"
#include "kernels/grouped_gemm_int4.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe::bench {

// The layer config for --shape (a preset or custom); softmax top-k with renormalisation.
MoeConfig bench_config(const BenchOptions& o);
std::string shape_names();  // "custom, qwen3-30b-a3b, ..."
bool is_shape(const std::string& name);

// Uniform [-scale, scale) values from a seed, as f32, rounded to `dtype` and back.
Tensor random_tensor(const Shape& shape, float scale, uint64_t seed, DType dtype = DType::F32);
// FP8 benches: routed expert e as e4m3 codes with one f32 scale per kFp8Block^2 block
// (DeepSeek-V3's 128 x 128): W13 [2I, H] and W2 [H, I].
inline constexpr int64_t kFp8Block = 128;
struct Fp8Expert {
  Tensor w13, s13, w2, s2;
};
Fp8Expert fp8_expert(const MoeConfig& cfg, int64_t e);
// Routed expert e: W13 [2I, H] and W2 [H, I] in f32 holding `dtype`-exact values (fp8:
// the bf16 dequantised values the kernel computes with).
std::pair<Tensor, Tensor> expert_weights(const MoeConfig& cfg, int64_t e, DType dtype);
// "bf16,int8" -> {"bf16", "int8"}.
std::vector<std::string> dtype_list(const std::string& s);
// Router, shared experts and experts [begin, end) (their MoE-TP slice tp_rank of tp).
// dtype I8: the routed experts W8A8 (quantised from the f32 weights, smooth = 1), the
// shared experts bf16. F8E4M3: routed experts from fp8_expert, shared experts bf16.
// int4_group > 0 (with dtype I8): the routed experts W4A8 instead, groups of int4_group k.
// coded (with dtype I8): the routed experts in that group-coded format instead (a GGUF
// symmetric type, bench_dtype's q8_0 / q5_0 / q4_0), quantised from the f32 weights.
MoeLayerWeights random_layer(const MoeConfig& cfg, DType dtype, int64_t begin, int64_t end, int tp_rank = 0,
                             int tp = 1, int64_t int4_group = 0, const CodedFormat* coded = nullptr);
// --dtype names: "int8" -> I8, "int4" -> I8 with *int4_group = group (else 0), "q8_0",
// "q5_0", "q4_0" -> I8 with *coded set (only where coded is given), others parse_dtype.
DType bench_dtype(const std::string& name, int64_t group, int64_t* int4_group, std::optional<CodedFormat>* coded = nullptr);
// Bytes a GEMM reads per expert of W13 + W2: the packed weights, plus FP8 block scales or
// int4 scales and zero points.
size_t expert_read_bytes(const MoeLayerWeights& w);

// The median of v (the mean of the two middle values for an even count; 0 if empty).
double median(std::vector<double> v);
// The largest v over the ranks of c (collective).
double max_over_ranks(Communicator& c, double v);

// --skew zipf:S -> S (>= 0); empty -> 0. Errors name the flag.
double parse_skew(const std::string& s);
// Skewed routing for the benches: the router gets a per-expert logit offset
// b_e = -S * beta * ln(rank_e + 1), rank_e a fixed random order of the experts; beta ~ 1
// is the Gumbel scale matching the router's logit spread (std 4/3 for random_layer's
// gate and random inputs), so that top-k choices follow p_e ~ (rank_e + 1)^-S
// approximately. The offset rides on the inputs' mean: skew_inputs adds kSkewOffset to
// every input value and skew_router makes gate row e = (row - its mean) + b_e / (H * offset),
// so x . row_e = r . (row_e - mean) + b_e (1 + sum(r) / (H * offset)). Call on the layer
// random_layer built (every rank the same gate).
inline constexpr float kSkewOffset = 0.25f;
void skew_router(const MoeConfig& cfg, MoeLayerWeights& w, double s);
void skew_inputs(Tensor& x);

// Compares y [n, H] against moe_reference on x [n, H] (experts rebuilt from their
// seeds). Returns "ok (...)" or "FAILED (...)"; *ok tells which.
std::string check_sample(const MoeConfig& cfg, const MoeLayerWeights& w, const Tensor& x, const Tensor& y, DType dtype,
                         bool* ok);

}  // namespace moe::bench
