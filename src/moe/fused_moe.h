// The MoE block of one decoder layer on one rank: gate -> route -> index ->
// expand -> GEMM1 + act -> GEMM2 -> combine, plus shared experts.
//
// Split as vLLM splits its fused MoE: MoeLayer::route (replicated gate and
// routing), ExpertsKernel::compute (the "experts" side: rows grouped by local
// expert in, per-row outputs out), and combine (weighted sum in slot order).
// The communication strategies of expert parallelism go between these pieces;
// forward() is the single-rank composition of them.
//
// Not thread-safe: a layer owns scratch buffers reused across calls.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "kernels/permute.h"
#include "moe/config.h"

namespace moe {

// A dense gated MLP: down(act(gate(x)) * up(x)). Shared experts and the MLP of
// dense layers. Runs on the grouped GEMM as one expert holding every row.
struct GatedMlpWeights {
  PackedExperts w13;  // 1 x [2I, H] (gate rows, then up rows)
  PackedExperts w2;   // 1 x [H, I]
  Activation act = Activation::SiluMul;
};

// W8A8 (SmoothQuant) layers hold w13/w2 as I8 (kernels/grouped_gemm.h): the routed
// experts only; the router stays f32 and the shared experts stay f32/bf16.
struct MoeLayerWeights {
  PackedExperts gate;     // f32, 1 x [E, H]: router logits = x . gate^T
  Tensor correction_bias;  // f32 [E] (noaux_tc, ERNIE moe_statics) or undefined
  // This rank holds expert slots [begin, end). Without replicas (slot_expert empty)
  // slot p is routed expert p; with them (moe/placement.h) slot p computes logical
  // expert slot_expert[p], of all P slots of the layer.
  int64_t expert_begin = 0;
  int64_t expert_end = 0;
  std::vector<int32_t> slot_expert;  // [P] or empty (P = E)
  PackedExperts w13;  // E_l x [2I, H], one per slot
  PackedExperts w2;   // E_l x [H, I]
  // W8A8 with smooth vectors: every routed expert's GEMM1 smooth vector, f32 [E, H], on
  // every rank (the dispatch sender quantises for the destination expert); rows
  // [begin, end) equal w13.smooth. Undefined: all ones (then w13.smooth is too).
  Tensor smooth_all;
  // W8A8 with static activation scales (calibrated checkpoints): every routed expert's
  // GEMM1 input step, f32 [E], on every rank for the same reason; entries [begin, end)
  // equal w13.act_scale. Undefined: dynamic per-token scales (then w13.act_scale is too).
  Tensor act_scale_all;
  std::optional<GatedMlpWeights> shared;
  Tensor shared_gate;  // f32 [H] (Qwen2-MoE shared_expert_gate) or undefined

  int64_t n_local() const { return expert_end - expert_begin; }
  int64_t n_slots(int64_t n_experts) const {
    return slot_expert.empty() ? n_experts : static_cast<int64_t>(slot_expert.size());
  }
  int64_t logical(int64_t slot) const { return slot_expert.empty() ? slot : slot_expert[slot]; }
};

// Scratch buffers that grow to the largest call seen. Not thread-safe.
struct MoeScratch {
  Tensor a;       // [rows, H] compute dtype: expanded rows / converted input (W8A8: Q8 rows)
  Tensor inter;   // [rows, I] compute dtype: GEMM1 output (W8A8: f32)
  Tensor inter_q;  // W8A8: [rows] Q8 rows of I, GEMM2's input
  Tensor out;     // [rows, H] f32: GEMM2 output
  Tensor x_f32;   // [T, H] f32 copy of a bf16 input (gate, shared gate)
  Tensor logits;  // [T, E] f32
  // Returns t reshaped to [rows, cols] of dtype, reallocating only when too small.
  static Tensor& ensure(Tensor& t, int64_t rows, int64_t cols, DType dtype);
};

// out[rows, H] f32 = W2 . act(W13 . a) for rows grouped by local expert.
struct ExpertsParams {
  const PackedExperts* w13 = nullptr;
  const PackedExperts* w2 = nullptr;
  Activation act = Activation::SiluMul;
  const void* a = nullptr;            // [rows, H] in w13->dtype (I8: Q8 rows, q8_row_bytes(H)
                                      // apart, quantised with each row's expert's smooth)
  const int64_t* offsets = nullptr;   // [n_local + 1], offsets[0] == 0
  float* out = nullptr;               // [rows, H] f32
};
void run_experts(const ExpertsParams& p, MoeScratch& scratch);

// y[T, H] f32 = mlp(x); x is [T, H] f32 or bf16.
void run_gated_mlp(const GatedMlpWeights& w, const Tensor& x, float* y, MoeScratch& scratch);

// Routing result of T tokens.
struct Routing {
  std::vector<float> weights;  // [T, k]
  std::vector<int32_t> ids;    // [T, k] expert slot ids (= expert ids without replicas)
  RouteIndex index;            // (token, k) choices sorted by slot
};

class Placement;

class MoeLayer {
 public:
  MoeLayer(const MoeConfig& cfg, MoeLayerWeights weights);

  const MoeConfig& config() const { return cfg_; }
  const MoeLayerWeights& weights() const { return w_; }
  DType compute_dtype() const { return w_.w13.act_dtype(); }  // FP8 weights: bf16
  // W8A8: the routed experts take Q8 rows (kernels/quant.h) as input.
  bool quantized() const { return w_.w13.dtype == DType::I8; }
  // Bytes of one routed-expert input row: H values in the compute dtype, or a Q8 row.
  size_t act_row_bytes() const;
  // W8A8: true when every routed expert has the same smooth vector (or none) and the
  // same static activation scale (or none), so one quantised row of a token serves all
  // its experts; else a token is quantised per (token, expert) slot.
  bool smooth_uniform() const { return smooth_uniform_; }
  // W8A8: quantises row x [H] (f32, bf16 or f16 of `dtype`) for global expert e into
  // a Q8 row at dst (act_row_bytes() bytes), exactly as routed_partial's expand does
  // (the smooth vector and static scale, if any, of slot e's expert).
  void quantize_for_expert(const void* x, DType dtype, int64_t e, void* dst) const;

  // Slots of the layer (P): n_experts without replicas.
  int64_t n_slots() const { return w_.n_slots(cfg_.n_experts); }
  // With replicas: the layer's placement (its slot_experts() equal the weights'), and
  // the salt offset of this rank's tokens (Placement::pick). route() then maps every
  // choice to a slot. The placement must outlive the setting; nullptr: none.
  void set_placement(const Placement* p, int64_t salt_offset);
  void set_salt_offset(int64_t salt_offset) { salt_offset_ = salt_offset; }

  // Gate + routing + gen_idx for x [T, H] (f32 or bf16). Adds the routed (logical)
  // experts to the counts of count_routed(), if set, then maps choices to slots.
  void route(const Tensor& x, Routing& r);
  // From now on every route() adds each (token, slot)'s expert to counts[E] (nullptr:
  // stop). Expert load statistics (Model::expert_load) come from the routing the layer
  // runs anyway instead of a second router GEMM. counts must outlive the setting.
  void count_routed(int64_t* counts) { load_counts_ = counts; }
  // y[T, H] f32 = sum, in slot order, of weight * expert output over the slots of r
  // whose expert this layer holds (a ragged gather: only those rows are computed).
  // x [T, H] holds the tokens r was computed for (f32, bf16 or f16).
  void routed_partial(const Tensor& x, const Routing& r, float* y);
  // Shared experts (with Qwen2's sigmoid gate) of x, written to y [T, H] f32
  // (y = shared(x) if !accumulate, else y += shared(x)). No-op without shared experts.
  // Uses its own scratch, so it may run on another thread while the routed experts
  // run (never two shared_experts calls at once).
  void shared_experts(const Tensor& x, float* y, bool accumulate);
  // The whole block on one rank holding all experts: returns y [T, H] f32.
  Tensor forward(const Tensor& x);
  // The same into the caller's y [T, H] f32 (overwritten): no output allocation per call.
  void forward(const Tensor& x, float* y);

  MoeScratch& scratch() { return scratch_; }

 private:
  const float* x_as_f32(const Tensor& x, MoeScratch& s);

  MoeConfig cfg_;
  MoeLayerWeights w_;
  MoeScratch scratch_;
  MoeScratch shared_scratch_;  // the shared experts' own, see shared_experts()
  bool smooth_uniform_ = true;
  Tensor shared_tmp_;          // [T, H] f32
  int64_t* load_counts_ = nullptr;  // [E], see count_routed()
  const Placement* placement_ = nullptr;  // see set_placement()
  int64_t salt_offset_ = 0;
  // Reused across calls so that a decode step allocates nothing here.
  Routing routing_;                       // forward()'s routing
  std::vector<int64_t> local_offsets_;    // routed_partial: [n_local + 1]
};

}  // namespace moe
