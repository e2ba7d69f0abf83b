// A plain, slow reference of the MoE block (llm.c style: the simplest code that
// can be right), built on route_reference and the unpacked weights. Tests and the
// benchmark's self-check compare the fast path against it.
#pragma once

#include <functional>
#include <utility>

#include "core/tensor.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe {

// The full f32 weights of routed expert e: W13 [2I, H] (gate rows, then up), W2 [H, I].
using ExpertWeightsFn = std::function<std::pair<Tensor, Tensor>(int64_t expert)>;

// y [T, H] f32 for x [T, H]. Router, bias and shared experts come from w; the routed
// experts from `experts` (default: unpacked from w, which must then hold all of
// them). With bf16 the reference rounds exactly where the kernels do (the expanded
// input rows and the GEMM1 output), and it accumulates in double.
Tensor moe_reference(const MoeConfig& cfg, const MoeLayerWeights& w, const Tensor& x,
                     const ExpertWeightsFn& experts = {});

// y [T, H] f32 of a dense gated MLP, rounding like the kernels for bf16 weights.
Tensor gated_mlp_reference(const GatedMlpWeights& w, const Tensor& x);

}  // namespace moe
