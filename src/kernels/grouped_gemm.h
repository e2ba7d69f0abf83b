// Grouped GEMM over experts: the two matmuls of the routed experts.
//
//   GEMM1: for each local expert e, rows a[off[e]:off[e+1], K] x W13[e]^T -> [rows, 2I],
//          with the gated activation act(gate) * up fused into the epilogue -> [rows, I].
//   GEMM2: [rows, I] x W2[e]^T -> [rows, H].
//
// Weights are packed once at load (pack_expert) into the layout the kernels read;
// the packed layout is private to grouped_gemm*.cpp. Empty experts cost nothing:
// work is split into (expert x output-block) tasks over the non-empty experts only.
// Two kernels: few rows per expert (decode, bandwidth-bound: stream each weight
// byte once) and many rows (prefill, compute-bound: register-blocked microkernel).
//
// W8A8 (dtype I8, SmoothQuant): int8 weights with one f32 scale per output channel,
// activations as Q8 rows (kernels/quant.h: int8[K], zero pad to 4, f32 scale), int32
// accumulation on vpdpbusd, dequantised in the epilogue: acc * a_scale[row] * w_scale[col].
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace moe {

enum class Activation : uint8_t {
  None,         // plain GEMM (W2, or ungated weights)
  SiluMul,      // silu(gate) * up
  GeluTanhMul,  // gelu_tanh(gate) * up   (HF "gelu_pytorch_tanh", "gelu_new")
  GeluErfMul,   // gelu_erf(gate) * up    (HF "gelu")
};

// The prepacked weights of n_experts matrices of shape [n, k] (nn.Linear: out x in).
// For gated weights (W13) the logical matrix is concat(gate [n/2, k], up [n/2, k])
// and the output of the GEMM with the activation is [rows, n/2].
struct PackedExperts {
  DType dtype = DType::F32;  // F32, BF16 or I8 (W8A8): the dtype the kernels read
  int64_t n_experts = 0;
  int64_t n = 0;  // output features per expert (2I for W13)
  int64_t k = 0;  // input features (reduction dim)
  bool gated = false;
  int64_t expert_stride = 0;  // elements of `dtype` between consecutive experts in data
  Tensor data;                // packed storage; layout private to the kernels
  // I8 only (undefined otherwise), indexed by packed column (n_panels * 64 per expert):
  Tensor w_scale;  // f32 [E, n_panels*64]: dequantisation scale of each packed column
  Tensor w_comp;   // i32 [E, n_panels*64]: 128 * sum_k q[col, k] (undoes vpdpbusd's +128 shift)
  // I8 only: the SmoothQuant smooth vector of each expert, f32 [E, k]; activations are
  // divided by it before quantisation (undefined: all ones). Set before pack_expert,
  // which then folds it into the float weights it quantises (w[n, k] * smooth[k]).
  Tensor smooth;

  int64_t n_out() const { return gated ? n / 2 : n; }
  size_t bytes_per_expert() const { return static_cast<size_t>(expert_stride) * dtype_size(dtype); }
};

// Allocates packed storage for n_experts [n, k] matrices in `dtype` (F32, BF16 or I8).
PackedExperts make_packed_experts(int64_t n_experts, int64_t n, int64_t k, DType dtype, bool gated);
// Packs one expert's weight w [n, k] (f32, bf16 or f16; for gated: gate rows then up rows)
// into slot e. Converts to the packed dtype (round-to-nearest-even for bf16). I8: multiplies
// by the expert's smooth vector (if set), then quantises per output channel (symmetric,
// scale = absmax / 127, q = nearbyint(w * (127 / absmax)), see kernels/quant.h).
void pack_expert(PackedExperts& p, int64_t e, const Tensor& w);
// I8: packs an already quantised expert: q int8 [n, k] and its per-output-channel scales
// (f32/bf16/f16 [n] or [n, 1]), e.g. a SmoothQuant checkpoint's qweight + per_channel_scale.
void pack_expert_q8(PackedExperts& p, int64_t e, const Tensor& q, const Tensor& scale);
// I8: sets the smooth vector of expert e (f32/bf16 [k], every value > 0 and finite).
void set_expert_smooth(PackedExperts& p, int64_t e, const Tensor& smooth);
// Asks the kernel for transparent huge pages on [data, data+bytes) (whole 2 MiB pages
// inside it; no-op where unsupported). Call before first touch. Streaming GB of expert
// weights through 4 KiB pages costs ~15% of read bandwidth on Zen4 (TLB walks, and the
// hardware prefetchers stop at every 4 KiB boundary); make_packed_experts does this.
void advise_huge_pages(void* data, size_t bytes);
// Unpacks expert e back to an f32 [n, k] tensor (tests and debugging; I8: q * scale).
Tensor unpack_expert(const PackedExperts& p, int64_t e);
// I8: expert e's int8 weights [n, k] and per-channel scales [n] f32 (tests, reference).
void unpack_expert_q8(const PackedExperts& p, int64_t e, Tensor& q, Tensor& scale);

struct GroupedGemmParams {
  const PackedExperts* w = nullptr;
  const void* a = nullptr;          // [rows, k], dtype == w->dtype, rows grouped by expert
                                    // (I8: Q8 rows, kernels/quant.h, quantised with the
                                    // expert's smooth vector)
  int64_t lda = 0;                  // elements between rows of a (I8: bytes, >= q8_row_bytes(k))
  const int64_t* offsets = nullptr;  // [w->n_experts + 1]: rows of expert e are [offsets[e], offsets[e+1])
  void* c = nullptr;                // [rows, w->n_out()]
  DType c_dtype = DType::F32;       // F32, or BF16 (GEMM1 output that feeds a bf16 GEMM2);
                                    // I8 weights also I32: the raw int32 accumulators
                                    // (exact; tests), only with act == None
  int64_t ldc = 0;                  // elements between rows of c
  Activation act = Activation::None;  // must be None unless w->gated
};

// Runs all experts' GEMMs, parallel over (expert x output block) tasks (OpenMP).
// Picks the kernel by rows per expert and the active ISA (core/cpu.h).
void grouped_gemm(const GroupedGemmParams& p);

// Plain reference: same contract, scalar loops over unpacked weights, f32 accumulation
// in the order k = 0..K-1. Rounds the output to c_dtype like the kernel. I8: exact integer
// sums of the int8 values, dequantised in the kernel's order ((float)acc * a_scale * w_scale).
void grouped_gemm_reference(const GroupedGemmParams& p);

// Scalar activation functions, exactly as the kernels' epilogues compute them.
float act_gate(Activation act, float gate);  // silu / gelu_tanh / gelu_erf of the gate value
Activation parse_activation(const std::string& hf_hidden_act);  // "silu", "gelu", "gelu_pytorch_tanh", ...

}  // namespace moe
