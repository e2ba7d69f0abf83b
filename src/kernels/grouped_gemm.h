// Grouped GEMM over experts: the two matmuls of the routed experts.
//
//   GEMM1: for each local expert e, rows a[off[e]:off[e+1], K] x W13[e]^T -> [rows, 2I],
//          with the gated activation act(gate) * up fused into the epilogue -> [rows, I].
//   GEMM2: [rows, I] x W2[e]^T -> [rows, H].
//
// Weights are packed once at load (pack_expert) into the layout the kernels read;
// the packed layout is private to grouped_gemm*.cpp and pack*.cpp. Empty experts cost nothing:
// work is split into (expert x output-block) tasks over the non-empty experts only.
// Two kernels: few rows per expert (decode, bandwidth-bound: stream each weight
// byte once) and many rows (prefill, compute-bound: register-blocked microkernel).
//
// W8A8 (dtype I8, SmoothQuant): int8 weights with one f32 scale per output channel,
// activations as Q8 rows (kernels/quant.h: int8[K], zero pad to 4, f32 scale), int32
// accumulation on vpdpbusd, dequantised in the epilogue: acc * a_scale[row] * w_scale[col].
//
// FP8 (dtype F8E4M3, weight-only, DeepSeek-V3 block scales): e4m3 weights stay 1 byte
// in memory; each task dequantises one panel at a time to bf16 (value * block scale,
// rounded to nearest even, exactly as dequantize_fp8_blocks) into a per-thread buffer
// that stays in L2, and runs the bf16 kernel on it. Activations are bf16.
#pragma once

#include <cstdint>
#include <span>

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
  DType dtype = DType::F32;  // F32, BF16, I8 (W8A8) or F8E4M3 (weight-only): the stored dtype
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
  // I8 only: static activation scale of each expert's input, f32 [E]: a calibrated
  // per-tensor step s (x ~= q * s, kernels/quant.h quantize_row_q8_static) used instead
  // of each row's absmax. Undefined: dynamic per-token scales (the default).
  Tensor act_scale;
  // F8E4M3 only: k values per scale block (even, divides k). The block scales live in
  // w_scale, f32 [E, n_panels * (k / block_k) * 128]: per panel and k block, the scale
  // of each of the 64 packed columns written twice (the k pair of a VNNI element), so
  // byte i of a panel's k-pair row is scaled by entry i: one vector load per 16 values.
  int64_t block_k = 0;
  // I8 with group-coded weights (kernels/grouped_gemm_int4.h) when > 0: k values per
  // weight group (int4: 32, 64 or 128; 8-bit codes also 16). Then data holds unsigned
  // codes of code_bits bits (4: nibbles, W4A8; 6: GGUF's 5- and 6-bit types; 8: bytes, Q8_0),
  // w_scale the f32 scale of each (packed column, group) and either w_zero (u8 zero
  // points: w = (u - z) * s) or w_offset (f32: w = u * s - offset, GGUF's Q4_K / Q5_K /
  // Q4_1 / Q5_1 mins); w_comp is undefined.
  int64_t int4_group = 0;
  int code_bits = 4;
  bool int4_zero_points = true;  // the quantiser pack_expert uses (asymmetric / symmetric)
  Tensor w_zero;    // u8 [E, n_panels * n_groups * 64], zero-point form (else undefined)
  Tensor w_offset;  // f32 [E, n_panels * n_groups * 64], offset form (else undefined)
  // Super-block scales (GGUF's K-quants) when > 0: groups per super-block (8 of 32 or 16
  // of 16: 256 k). Then each group's scale is D * sc and its offset M * mn, the products
  // ggml's dequantiser forms (exact in f32), with w_scale / w_offset undefined:
  Tensor w_sb_d;  // f16 [E, n_panels * n_superblocks * 64]: D (the block's d)
  Tensor w_sb_m;  // f16 [E, n_panels * n_superblocks * 64]: M (dmin), offset form only
  Tensor w_sc;    // i8 [E, n_panels * n_groups * 64]: sc (6-bit K scales; Q6_K's signed ones)
  Tensor w_mn;    // u8 [E, n_panels * n_groups * 64]: mn (6-bit mins), offset form only
  // (sb_groups 1: one group per super-block, w_sc / w_mn undefined: factors of 1, an f16
  // scale and offset per group; GGUF's Q4_0, Q8_0, ... d)
  int64_t sb_groups = 0;
  // Zero-point form with one zero point for every group (CodedFormat::zero): this code,
  // and w_zero undefined. -1: w_zero holds them (or the offset form).
  int uniform_zero = -1;
  // Group-coded weights only (undefined otherwise: column j reads input j): i32 [E, k],
  // column j of expert e's weight reads input column in_perm[e][j]. An act-order GPTQ
  // expert's columns sorted by group (loader/hf_int4): grouped_gemm gathers each expert's
  // activation rows in this order first, so the kernels see whole groups.
  Tensor in_perm;

  int64_t n_out() const { return gated ? n / 2 : n; }
  // The dtype of activation rows for these weights: bf16 for FP8 (weight-only), else dtype.
  DType act_dtype() const { return dtype == DType::F8E4M3 ? DType::BF16 : dtype; }
  size_t bytes_per_expert() const { return static_cast<size_t>(expert_stride) * dtype_size(dtype); }
};

// Allocates packed storage for n_experts [n, k] matrices in `dtype` (F32, BF16 or I8).
PackedExperts make_packed_experts(int64_t n_experts, int64_t n, int64_t k, DType dtype, bool gated);
// Packs one expert's weight w [n, k] (f32, bf16 or f16; for gated: gate rows then up rows)
// into slot e. Converts to the packed dtype (round-to-nearest-even for bf16). I8: multiplies
// by the expert's smooth vector (if set), then quantises per output channel (symmetric,
// scale = absmax / 127, q = nearbyint(w * (127 / absmax)), see kernels/quant.h).
void pack_expert(PackedExperts& p, int64_t e, const Tensor& w);
// Gated (W13) weights from the separate gate [n/2, k] and up [n/2, k] projections (same
// float dtype; any row stride, e.g. zero-copy views of a checkpoint): the same result as
// pack_expert of their stacked rows, without building the stacked copy.
void pack_expert_gated(PackedExperts& p, int64_t e, const Tensor& gate, const Tensor& up);
// I8: packs an already quantised expert: q int8 [n, k] and its per-output-channel scales
// (f32/bf16/f16 [n] or [n, 1]), e.g. a SmoothQuant checkpoint's qweight + per_channel_scale.
void pack_expert_q8(PackedExperts& p, int64_t e, const Tensor& q, const Tensor& scale);
// I8: sets the smooth vector of expert e (f32/bf16 [k], every value > 0 and finite).
void set_expert_smooth(PackedExperts& p, int64_t e, const Tensor& smooth);
// I8: sets the static activation scale of expert e (finite, > 0). Once one expert has
// one, every expert must (MoeLayer checks).
void set_expert_act_scale(PackedExperts& p, int64_t e, float s);
// FP8: allocates n_experts [n, k] e4m3 matrices whose scale blocks are block_k wide in k
// (block_k even and dividing k; the block height is given per expert to pack_expert_fp8).
PackedExperts make_packed_experts_fp8(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t block_k);
// FP8: packs expert e from w, F8E4M3 [n, k] (gated: gate rows then up rows), and its block
// scales scale_inv, f32/bf16 [n / block_n, k / block_k] (w[i, j] means
// e4m3(w[i, j]) * scale_inv[i / block_n, j / block_k], DeepSeek-V3's weight_scale_inv).
// Errors: block shape not dividing w, scale shape, NaN codes, scales that are not finite or
// so small that a product would leave bf16's normal range (the kernel flushes those).
void pack_expert_fp8(PackedExperts& p, int64_t e, const Tensor& w, const Tensor& scale_inv, int64_t block_n);
// Asks the kernel for transparent huge pages on [data, data+bytes) (whole 2 MiB pages
// inside it; no-op where unsupported). Call before first touch. Streaming GB of expert
// weights through 4 KiB pages costs ~15% of read bandwidth on Zen4 (TLB walks, and the
// hardware prefetchers stop at every 4 KiB boundary); make_packed_experts does this.
void advise_huge_pages(void* data, size_t bytes);
// A contiguous zero-filled tensor. From 2 MiB up it is a private anonymous mapping on a
// 2 MiB boundary with huge pages advised: the kernel hands out its pages already zeroed,
// so no pass of ours writes the zeros, and each page is faulted in by whoever first
// writes it (the packers, on every thread) instead of by one memset. Smaller: zeros().
Tensor zeroed_huge_pages(const Shape& shape, DType dtype);
// Moving expert slots (load balancing, moe/placement.h): expert e of a PackedExperts
// is its packed weights plus its row of every per-expert side tensor (w_scale, w_comp,
// smooth, act_scale, w_zero); expert_pieces lists those byte ranges in a fixed order
// (the same for every PackedExperts of one format), so a copy or a transfer piece by
// piece is bit-exact in every format and needs no staging buffer.
struct BytePiece {
  char* data;
  size_t bytes;
};
std::vector<BytePiece> expert_pieces(const PackedExperts& p, int64_t e);
// dst's expert d = src's expert s (same format: dtype, shape, block sizes, side tensors).
void copy_expert(PackedExperts& dst, int64_t d, const PackedExperts& src, int64_t s);
// n_experts zeroed slots of p's format (dtype, shape, block sizes, side tensors).
PackedExperts make_packed_like(const PackedExperts& p, int64_t n_experts);
// Unpacks expert e back to an f32 [n, k] tensor (tests and debugging; I8: q * scale;
// F8E4M3: the bf16 values the kernel computes with; with in_perm, in input column order).
Tensor unpack_expert(const PackedExperts& p, int64_t e);
// I8: expert e's int8 weights [n, k] and per-channel scales [n] f32 (tests, reference).
void unpack_expert_q8(const PackedExperts& p, int64_t e, Tensor& q, Tensor& scale);

struct GroupedGemmParams {
  const PackedExperts* w = nullptr;
  const void* a = nullptr;          // [rows, k], dtype == w->act_dtype(), rows grouped by expert
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
// grouped_gemm of each of ps (different weights and outputs: attention's q, k and v), the
// same tasks and so the same bits, in one parallel region: one wake-up and one join of the
// team instead of one per GEMM (the small k and v GEMVs of a decode step take microseconds).
void grouped_gemm_many(std::span<const GroupedGemmParams> ps);
// How many tasks grouped_gemm(p) makes for a team of `threads` (tests: that a few-panel
// decode GEMV is cut into column windows when the team is larger than its panels).
int64_t grouped_gemm_task_count(const GroupedGemmParams& p, int threads);

// Plain reference: same contract, scalar loops over unpacked weights, f32 accumulation
// in the order k = 0..K-1. Rounds the output to c_dtype like the kernel. I8: exact integer
// sums of the int8 values, dequantised in the kernel's order ((float)acc * a_scale * w_scale).
void grouped_gemm_reference(const GroupedGemmParams& p);

// Scalar activation functions, exactly as the kernels' epilogues compute them.
float act_gate(Activation act, float gate);  // silu / gelu_tanh / gelu_erf of the gate value
Activation parse_activation(const std::string& hf_hidden_act);  // "silu", "gelu", "gelu_pytorch_tanh", ...

}  // namespace moe
