#include "moe/fused_moe.h"
#include "moe/placement.h"

#include <cmath>

#include "core/check.h"
#include "core/stage_profile.h"
#include "kernels/quant.h"

namespace moe {

Tensor& MoeScratch::ensure(Tensor& t, int64_t rows, int64_t cols, DType dtype) {
  const int64_t need = std::max<int64_t>(rows * cols, 1);
  if (!t.defined() || t.dtype() != dtype || t.numel() < need) t = Tensor::empty({need}, dtype);
  // Keep the full capacity; callers index by pointer. Reshaped only if someone stored a
  // shaped tensor here: a reshape per call allocates its shape and strides (decode runs
  // this ~15 times per step).
  if (t.ndim() != 1) t = t.reshape({t.numel()});
  return t;
}

void run_experts(const ExpertsParams& p, MoeScratch& s) {
  const int64_t n_local = p.w13->n_experts;
  const int64_t rows = p.offsets[n_local];
  if (rows == 0) return;
  const int64_t I = p.w13->n_out(), H = p.w2->n_out();
  const bool q8 = p.w13->dtype == DType::I8;
  // W8A8: GEMM1 writes its activated output in f32 and one "smooth + quantise rows" pass
  // makes GEMM2's Q8 rows. A row's scale needs the max over the whole row, but GEMM1's
  // tasks split a row's columns over panels (threads); the separate pass costs one
  // read of rows x I floats (small next to GEMM1) and keeps the kernels batch-invariant.
  Tensor& inter = MoeScratch::ensure(s.inter, rows, I, q8 ? DType::F32 : p.w2->act_dtype());

  GroupedGemmParams g1;
  g1.w = p.w13;
  g1.a = p.a;
  g1.lda = q8 ? q8_row_bytes(p.w13->k) : p.w13->k;
  g1.offsets = p.offsets;
  g1.c = inter.raw();
  g1.c_dtype = q8 ? DType::F32 : p.w2->act_dtype();
  g1.ldc = I;
  g1.act = p.act;
  {
    prof::Scope ps(prof::kGemm1);
    grouped_gemm(g1);
  }

  const void* a2 = inter.raw();
  if (q8) {
    Tensor& iq = MoeScratch::ensure(s.inter_q, rows, q8_row_bytes(I), DType::I8);
    QuantizeRowsParams qp;
    qp.x = inter.raw();
    qp.ldx = I;
    qp.rows = rows;
    qp.k = I;
    qp.offsets = p.offsets;
    qp.n_experts = p.w2->n_experts;
    qp.smooth = p.w2->smooth.defined() ? p.w2->smooth.data<float>() : nullptr;
    qp.static_scale = p.w2->act_scale.defined() ? p.w2->act_scale.data<float>() : nullptr;
    qp.dst = iq.raw();
    qp.ld_dst = q8_row_bytes(I);
    prof::Scope ps(prof::kActQuant);
    quantize_rows_q8(qp);
    a2 = iq.raw();
  }

  GroupedGemmParams g2;
  g2.w = p.w2;
  g2.a = a2;
  g2.lda = q8 ? q8_row_bytes(I) : I;
  g2.offsets = p.offsets;
  g2.c = p.out;
  g2.c_dtype = DType::F32;
  g2.ldc = H;
  prof::Scope ps(prof::kGemm2);
  grouped_gemm(g2);
}

void run_gated_mlp(const GatedMlpWeights& w, const Tensor& x, float* y, MoeScratch& s) {
  const int64_t T = x.dim(0), H = x.dim(1);
  MOE_CHECK(H == w.w13.k, "MLP input has hidden size {}, expected {}", H, w.w13.k);
  if (T == 0) return;
  const DType ct = w.w13.act_dtype();
  const void* a = x.raw();
  if (ct == DType::I8) {
    Tensor& buf = MoeScratch::ensure(s.a, T, q8_row_bytes(H), DType::I8);
    QuantizeRowsParams qp;
    qp.x = x.raw();
    qp.x_dtype = x.dtype();
    qp.ldx = H;
    qp.rows = T;
    qp.k = H;
    qp.smooth = w.w13.smooth.defined() ? w.w13.smooth.data<float>() : nullptr;
    qp.static_scale = w.w13.act_scale.defined() ? w.w13.act_scale.data<float>() : nullptr;
    qp.dst = buf.raw();
    qp.ld_dst = q8_row_bytes(H);
    quantize_rows_q8(qp);
    a = buf.raw();
  } else if (x.dtype() != ct) {
    Tensor& buf = MoeScratch::ensure(s.a, T, H, ct);
    if (x.dtype() == DType::F32) {
      convert_from_f32(x.data<float>(), buf.raw(), ct, T * H);
    } else {
      MOE_CHECK(ct == DType::F32, "MLP input dtype {} with compute dtype {}", dtype_name(x.dtype()), dtype_name(ct));
      convert_to_f32(x.raw(), x.dtype(), buf.data<float>(), T * H);
    }
    a = buf.raw();
  }
  const int64_t offsets[2] = {0, T};
  ExpertsParams p;
  p.w13 = &w.w13;
  p.w2 = &w.w2;
  p.act = w.act;
  p.a = a;
  p.offsets = offsets;
  p.out = y;
  run_experts(p, s);
}

MoeLayer::MoeLayer(const MoeConfig& cfg, MoeLayerWeights weights) : cfg_(cfg), w_(std::move(weights)) {
  const int64_t H = cfg_.hidden_size, I = cfg_.moe_intermediate_size, E = cfg_.n_experts;
  MOE_CHECK(w_.gate.n_experts == 1 && w_.gate.n == E && w_.gate.k == H && w_.gate.dtype == DType::F32,
            "router gate must be f32 [{}, {}]", E, H);
  const int64_t P = n_slots();
  MOE_CHECK(0 <= w_.expert_begin && w_.expert_begin <= w_.expert_end && w_.expert_end <= P,
            "expert range [{}, {}) outside [0, {})", w_.expert_begin, w_.expert_end, P);
  for (const int32_t e : w_.slot_expert)
    MOE_CHECK(0 <= e && e < E, "expert slot names expert {}, outside [0, {})", e, E);
  // Under MoE-TP a rank holds I_l = I / tp intermediate rows of each expert.
  const int64_t Il = w_.w13.n / 2;
  MOE_CHECK(Il > 0 && I % Il == 0 && w_.w13.n_experts == w_.n_local() && w_.w13.k == H && w_.w13.gated,
            "W13 must hold {} experts of [2 * I / tp, {}] with I = {}", w_.n_local(), H, I);
  MOE_CHECK(w_.w2.n_experts == w_.n_local() && w_.w2.n == H && w_.w2.k == Il && w_.w2.dtype == w_.w13.dtype,
            "W2 must hold {} experts of [{}, {}]", w_.n_local(), H, Il);
  MOE_CHECK(!cfg_.routing.use_correction_bias || w_.correction_bias.numel() == E,
            "e_score_correction_bias must hold {} values", E);
  MOE_CHECK(!cfg_.shared_expert_gate || w_.shared_gate.numel() == H, "shared_expert_gate must hold {} values", H);
  // W8A8 smooth vectors: all experts' on every rank, matching the local experts' own.
  MOE_CHECK(!w_.smooth_all.defined() || quantized(), "smooth vectors given for {} (not W8A8) experts",
            dtype_name(compute_dtype()));
  if (quantized() && (w_.smooth_all.defined() || w_.w13.smooth.defined())) {
    MOE_CHECK(w_.smooth_all.defined() && w_.smooth_all.dtype() == DType::F32 && w_.smooth_all.numel() == E * H,
              "W8A8: the smooth vectors of all {} routed experts ([{}, {}] f32) are needed on every rank, got {}", E,
              E, H, w_.smooth_all.defined() ? w_.smooth_all.describe() : std::string("none"));
    for (int64_t e = w_.expert_begin; e < w_.expert_end; ++e) {
      const float* a = w_.smooth_all.data<float>() + w_.logical(e) * H;
      const bool own = w_.w13.smooth.defined();
      for (int64_t h = 0; h < H; ++h)
        MOE_CHECK((own ? w_.w13.smooth.data<float>()[(e - w_.expert_begin) * H + h] : 1.0f) == a[h],
                  "W8A8: expert {}'s smooth vector differs between its weights and the table of all experts (at {})",
                  w_.logical(e), h);
    }
    const float* s0 = w_.smooth_all.data<float>();
    for (int64_t i = 0; i < E * H && smooth_uniform_; ++i) smooth_uniform_ = s0[i] == s0[i % H];
  }
  // Static activation scales: GEMM1's of all experts on every rank (as smooth vectors),
  // GEMM2's of the local experts; a table with a hole (0: never set) is an error.
  MOE_CHECK((!w_.act_scale_all.defined() && !w_.w13.act_scale.defined() && !w_.w2.act_scale.defined()) ||
                quantized(),
            "static activation scales given for {} (not W8A8) experts", dtype_name(compute_dtype()));
  MOE_CHECK(w_.act_scale_all.defined() == w_.w13.act_scale.defined(),
            "W8A8: static GEMM1 activation scales must be given for the local experts and for all {} experts "
            "(act_scale_all), or for neither",
            E);
  if (w_.act_scale_all.defined()) {
    MOE_CHECK(w_.act_scale_all.dtype() == DType::F32 && w_.act_scale_all.numel() == E,
              "W8A8: act_scale_all must be f32 [{}], got {}", E, w_.act_scale_all.describe());
    const float* all = w_.act_scale_all.data<float>();
    for (int64_t e = 0; e < E; ++e)
      MOE_CHECK(std::isfinite(all[e]) && all[e] > 0.0f, "W8A8: static GEMM1 activation scale of expert {} is {}", e,
                all[e]);
    for (int64_t e = w_.expert_begin; e < w_.expert_end; ++e)
      MOE_CHECK(w_.w13.act_scale.data<float>()[e - w_.expert_begin] == all[w_.logical(e)],
                "W8A8: expert {}'s static GEMM1 activation scale differs between its weights and act_scale_all",
                w_.logical(e));
    for (int64_t e = 0; e < E && smooth_uniform_; ++e) smooth_uniform_ = all[e] == all[0];
  }
  if (w_.w2.act_scale.defined())
    for (int64_t e = 0; e < w_.n_local(); ++e)
      MOE_CHECK(w_.w2.act_scale.data<float>()[e] > 0.0f, "W8A8: static GEMM2 activation scale of expert {} not set",
                w_.logical(w_.expert_begin + e));
}

void MoeLayer::set_placement(const Placement* p, int64_t salt_offset) {
  if (p) {
    MOE_CHECK(p->n_experts() == cfg_.n_experts && p->n_slots() == n_slots() &&
                  (w_.slot_expert.empty() ? p->identity() : p->slot_experts() == w_.slot_expert),
              "the layer's expert slots differ from its placement ({})", p->describe());
  }
  placement_ = p && !p->identity() ? p : nullptr;
  salt_offset_ = salt_offset;
}

size_t MoeLayer::act_row_bytes() const {
  const int64_t H = cfg_.hidden_size;
  return quantized() ? static_cast<size_t>(q8_row_bytes(H)) : static_cast<size_t>(H) * dtype_size(compute_dtype());
}

void MoeLayer::quantize_for_expert(const void* x, DType dtype, int64_t e, void* dst) const {
  const int64_t H = cfg_.hidden_size;
  e = w_.logical(e);
  const float* sm = w_.smooth_all.defined() ? w_.smooth_all.data<float>() + e * H : nullptr;
  const float* xf = static_cast<const float*>(x);
  thread_local std::vector<float> buf;
  if (dtype != DType::F32) {
    buf.resize(H);
    convert_to_f32(x, dtype, buf.data(), H);
    xf = buf.data();
  }
  if (w_.act_scale_all.defined())
    quantize_row_q8_static(xf, sm, H, w_.act_scale_all.data<float>()[e], dst);
  else
    quantize_row_q8(xf, sm, H, dst);
}

const float* MoeLayer::x_as_f32(const Tensor& x, MoeScratch& s) {
  if (x.dtype() == DType::F32) return x.data<float>();
  Tensor& buf = MoeScratch::ensure(s.x_f32, x.dim(0), x.dim(1), DType::F32);
  convert_to_f32(x.raw(), x.dtype(), buf.data<float>(), x.numel());
  return buf.data<float>();
}

void MoeLayer::route(const Tensor& x, Routing& r) {
  prof::Scope ps(prof::kRoute);
  const int64_t T = x.dim(0), E = cfg_.n_experts, k = cfg_.top_k;
  r.weights.resize(T * k);
  r.ids.resize(T * k);
  if (T > 0) {
    Tensor& logits = MoeScratch::ensure(scratch_.logits, T, E, DType::F32);
    GroupedGemmParams g;
    g.w = &w_.gate;
    g.a = x_as_f32(x, scratch_);
    g.lda = cfg_.hidden_size;
    const int64_t offsets[2] = {0, T};
    g.offsets = offsets;
    g.c = logits.raw();
    g.c_dtype = DType::F32;
    g.ldc = E;
    grouped_gemm(g);

    RoutingParams rp;
    rp.cfg = cfg_.routing;
    rp.n_tokens = T;
    rp.n_experts = E;
    rp.top_k = k;
    rp.logits = logits.data<float>();
    rp.correction_bias = w_.correction_bias.defined() ? w_.correction_bias.data<float>() : nullptr;
    rp.weights = r.weights.data();
    rp.ids = r.ids.data();
    moe::route(rp);
    if (load_counts_)
      for (const int32_t e : r.ids) ++load_counts_[e];
    if (placement_)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) r.ids[t * k + j] = placement_->pick(r.ids[t * k + j], t + salt_offset_);
  }
  gen_idx(r.ids.data(), T, k, n_slots(), r.index);
}

void MoeLayer::shared_experts(const Tensor& x, float* y, bool accumulate) {
  if (!w_.shared) return;
  const int64_t T = x.dim(0), H = cfg_.hidden_size;
  if (T == 0) return;
  prof::Scope ps(prof::kShared);
  float* dst = y;
  if (accumulate) {
    shared_tmp_ = MoeScratch::ensure(shared_tmp_, T, H, DType::F32);
    dst = shared_tmp_.data<float>();
  }
  run_gated_mlp(*w_.shared, x, dst, shared_scratch_);
  if (cfg_.shared_expert_gate) {
    // Qwen2-MoE: shared output scaled per token by sigmoid(x . w_gate).
    const float* xf = x_as_f32(x, shared_scratch_);
    const float* g = w_.shared_gate.data<float>();
    for (int64_t t = 0; t < T; ++t) {
      float dot = 0.f;
      for (int64_t h = 0; h < H; ++h) dot += xf[t * H + h] * g[h];
      const float s = 1.f / (1.f + std::exp(-dot));
      for (int64_t h = 0; h < H; ++h) dst[t * H + h] *= s;
    }
  }
  if (accumulate)
    for (int64_t i = 0; i < T * H; ++i) y[i] += dst[i];
}

void MoeLayer::routed_partial(const Tensor& x, const Routing& r, float* y) {
  const int64_t H = cfg_.hidden_size;
  const int64_t b = w_.expert_begin, e = w_.expert_end;
  const int64_t rows = r.index.rows_in(b, e);
  const DType ct = compute_dtype();
  Tensor& a = quantized() ? MoeScratch::ensure(scratch_.a, rows, q8_row_bytes(H), DType::I8)
                          : MoeScratch::ensure(scratch_.a, rows, H, ct);
  ExpandParams ep;
  ep.x = x.raw();
  ep.x_dtype = x.dtype();
  ep.hidden = H;
  ep.ldx = H;
  ep.index = &r.index;
  ep.expert_begin = b;
  ep.expert_end = e;
  ep.out = a.raw();
  ep.out_dtype = ct;
  {
    prof::Scope ps(prof::kExpand);
    if (quantized())  // expand + smooth + quantise in one pass
      expand_quantize_q8(ep, w_.w13.smooth.defined() ? w_.w13.smooth.data<float>() : nullptr,
                         w_.w13.act_scale.defined() ? w_.w13.act_scale.data<float>() : nullptr);
    else
      expand(ep);
  }

  // Expert offsets relative to this layer's first row.
  std::vector<int64_t>& offsets = local_offsets_;  // reused: no allocation per call
  offsets.resize(w_.n_local() + 1);
  for (int64_t i = 0; i <= w_.n_local(); ++i) offsets[i] = r.index.offsets[b + i] - r.index.offsets[b];
  Tensor& out = MoeScratch::ensure(scratch_.out, rows, H, DType::F32);
  ExpertsParams xp;
  xp.w13 = &w_.w13;
  xp.w2 = &w_.w2;
  xp.act = cfg_.act;
  xp.a = a.raw();
  xp.offsets = offsets.data();
  xp.out = out.data<float>();
  run_experts(xp, scratch_);

  CombineParams cp;
  cp.expert_out = out.data<float>();
  cp.pos_base = r.index.offsets[b];
  cp.expert_begin = b;
  cp.expert_end = e;
  cp.ids = r.ids.data();
  cp.weights = r.weights.data();
  cp.index = &r.index;
  cp.hidden = H;
  cp.y = y;
  MOE_DCHECK(r.index.n_tokens == x.dim(0));
  prof::Scope ps(prof::kCombine);
  combine(cp);
}

Tensor MoeLayer::forward(const Tensor& x) {
  MOE_CHECK(x.ndim() == 2, "MoE input 'hidden_states' has shape {}, expected [T, {}]", shape_str(x.shape()),
            cfg_.hidden_size);
  Tensor y = Tensor::empty({x.dim(0), cfg_.hidden_size}, DType::F32);
  forward(x, y.data<float>());
  return y;
}

void MoeLayer::forward(const Tensor& x, float* y) {
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == cfg_.hidden_size && x.is_contiguous(),
            "MoE input 'hidden_states' has shape {}, expected [T, {}]", shape_str(x.shape()), cfg_.hidden_size);
  MOE_CHECK(w_.expert_begin == 0 && w_.expert_end == n_slots(),
            "single-rank forward needs all {} expert slots, this layer holds [{}, {})", n_slots(), w_.expert_begin,
            w_.expert_end);
  const int64_t T = x.dim(0), H = cfg_.hidden_size;
  if (T == 0) return;
  std::fill(y, y + T * H, 0.f);
  route(x, routing_);
  routed_partial(x, routing_, y);
  shared_experts(x, y, /*accumulate=*/true);
}

}  // namespace moe
