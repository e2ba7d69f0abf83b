// A plain, slow reference of the MoE block (llm.c style: the simplest code that
// can be right), built on route_reference and the unpacked weights. Tests and the
// benchmark's self-check compare the fast path against it.
#pragma once

#include "core/tensor.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe {

// y [T, H] f32 for x [T, H]. The weights must hold all experts. When the layer's
// compute dtype is bf16 the reference rounds exactly where the kernels do (the
// expanded input rows and the GEMM1 output), and accumulates in double.
Tensor moe_reference(const MoeConfig& cfg, const MoeLayerWeights& w, const Tensor& x);

// y [T, H] f32 of a dense gated MLP, rounding like the kernels for bf16 weights.
Tensor gated_mlp_reference(const GatedMlpWeights& w, const Tensor& x);

}  // namespace moe
