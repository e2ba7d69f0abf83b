#include "loader/quant_weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>

#include "core/check.h"
#include "loader/scales.h"
#include "loader/shard.h"

namespace moe {

namespace {

// "...experts.{}.gate_proj.weight" with id e, the ".weight" dropped: "...experts.3.gate_proj".
std::string proj_base(const std::string& pattern, int64_t e) {
  std::string k = fmt::format(fmt::runtime(pattern), e);
  static const std::string kWeight = ".weight";
  if (k.ends_with(kWeight)) k.resize(k.size() - kWeight.size());
  return k;
}


// ---- key names ------------------------------------------------------------------

// xLLM SmoothQuant keys of one expert: [0] gate, [1] up, [2] down.
struct SqKeys {
  std::string q[3], scale[3], smooth[3];
};
SqKeys sq_keys(const MlpKeys& k, int64_t e) {
  SqKeys s;
  const std::string* pats[3] = {&k.expert_gate, &k.expert_up, &k.expert_down};
  for (int i = 0; i < 3; ++i) {
    const std::string b = proj_base(*pats[i], e);
    s.q[i] = b + ".qweight";
    s.scale[i] = b + ".per_channel_scale";
    s.smooth[i] = b + ".smooth";
  }
  return s;
}
constexpr const char* kSqSuffix[3] = {".qweight", ".per_channel_scale", ".smooth"};

// The checkpoint patterns (relative to "model.layers.L.", "{e}" = expert id) of the
// FastDeploy expert names, taken from the family's scale table so that the names live
// in one place (loader/scales.cpp).
struct FdPatterns {
  std::string ug_weight_scale, dn_weight_scale;  // per expert
  std::string ug_act_shared, ug_act_expert;      // one for all experts / a copy per expert
  std::string dn_act;                            // per expert
  bool complete() const {
    return !ug_weight_scale.empty() && !dn_weight_scale.empty() && !ug_act_shared.empty() && !dn_act.empty();
  }
};
const FdPatterns& fd_patterns(Family f) {
  static std::mutex mu;
  static std::map<Family, FdPatterns> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(f);
  if (it != cache.end()) return it->second;
  FdPatterns p;
  for (const ScaleMapEntry& e : scale_map(f)) {
    const bool per_e = e.checkpoint.find("{e}") != std::string::npos;
    if (e.engine == "mlp.experts.up_gate_proj_weight_scale" && per_e) p.ug_weight_scale = e.checkpoint;
    if (e.engine == "mlp.experts.down_proj_weight_scale" && per_e) p.dn_weight_scale = e.checkpoint;
    if (e.engine == "mlp.experts.up_gate_proj_in_scale") (per_e ? p.ug_act_expert : p.ug_act_shared) = e.checkpoint;
    if (e.engine == "mlp.experts.down_proj_in_scale" && per_e) p.dn_act = e.checkpoint;
  }
  return cache.emplace(f, p).first->second;
}

std::string fill_e(const std::string& pat, int64_t e) {
  std::string s = pat;
  const size_t ph = s.find("{e}");
  if (ph != std::string::npos) s.replace(ph, 3, std::to_string(e));
  return s;
}
std::string drop_suffix(std::string s, const std::string& suffix) {
  if (s.ends_with(suffix)) s.resize(s.size() - suffix.size());
  return s;
}

// FastDeploy keys of one expert (full names).
struct FdKeys {
  std::string ug_w, ug_ws, dn_w, dn_ws, ug_act_expert, dn_act;
};
FdKeys fd_keys(const FdPatterns& p, int64_t layer, int64_t e) {
  const std::string L = fmt::format("model.layers.{}.", layer);
  FdKeys k;
  k.ug_ws = L + fill_e(p.ug_weight_scale, e);
  k.dn_ws = L + fill_e(p.dn_weight_scale, e);
  k.ug_w = drop_suffix(k.ug_ws, "_scale");  // "...up_gate_proj.weight"
  k.dn_w = drop_suffix(k.dn_ws, "_scale");
  if (!p.ug_act_expert.empty()) k.ug_act_expert = L + fill_e(p.ug_act_expert, e);
  k.dn_act = L + fill_e(p.dn_act, e);
  return k;
}
std::string fd_shared_act_key(const FdPatterns& p, int64_t layer) {
  return fmt::format("model.layers.{}.", layer) + p.ug_act_shared;
}

// ---- header checks ----------------------------------------------------------------

struct Problems {
  std::vector<TensorProblem> list;
  size_t max = SIZE_MAX;
  bool full() const { return list.size() >= max; }
  void add(TensorProblem::Kind k, const std::string& key, std::string msg) {
    if (!full()) list.push_back({k, key, std::move(msg)});
  }
};

enum class Want { Int8, Float };

std::string shapes_str(const std::vector<Shape>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? " or " : "") + shape_str(shapes[i]);
  return s;
}

// Presence, dtype and shape (one of `shapes`) of `key`; `what` says what the tensor is.
void check_tensor(const Checkpoint& ck, int64_t layer, const std::string& key, const std::vector<Shape>& shapes,
                  Want want, const std::string& what, Problems& out) {
  if (out.full()) return;
  if (!ck.has(key)) {
    out.add(TensorProblem::Missing, key,
            fmt::format("layer {}: tensor '{}' missing from checkpoint {} (expected {} {}: {})", layer, key,
                        ck.dir(), want == Want::Int8 ? "i8" : "f32/bf16/f16", shapes_str(shapes), what));
    return;
  }
  const TensorInfo& ti = ck.info(key);
  if (want == Want::Int8 ? ti.dtype != DType::I8 : !is_float_weight(ti.dtype)) {
    out.add(TensorProblem::WrongDType, key,
            fmt::format("layer {}: tensor '{}' in {} has dtype {}, expected {} ({})", layer, key, ck.file_of(key),
                        dtype_name(ti.dtype), want == Want::Int8 ? "i8" : "f32, bf16 or f16", what));
    return;
  }
  for (const Shape& s : shapes)
    if (ti.shape == s) return;
  out.add(TensorProblem::WrongShape, key,
          fmt::format("layer {}: tensor '{}' in {} has shape {}, expected {} ({})", layer, key, ck.file_of(key),
                      shape_str(ti.shape), shapes_str(shapes), what));
}

// Per-output-channel scales of an [n, k] weight: [n] or [n, 1].
std::vector<Shape> channel_shapes(int64_t n) { return {{n}, {n, 1}}; }
const std::vector<Shape> kScalarShapes = {{}, {1}};

void check_smoothquant(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, int64_t b, int64_t e,
                       Problems& out) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const MlpKeys mk = mlp_keys(cfg, layer, &ck);
  const int64_t n[3] = {I, I, H}, k[3] = {H, H, I};
  for (int64_t g = b; g < e && !out.full(); ++g) {
    const SqKeys K = sq_keys(mk, g);
    for (int p = 0; p < 3; ++p) {
      check_tensor(ck, layer, K.q[p], {{n[p], k[p]}}, Want::Int8, "the int8 weight [out, in]", out);
      check_tensor(ck, layer, K.scale[p], channel_shapes(n[p]), Want::Float,
                   fmt::format("one scale per output channel of '{}' {}", K.q[p], shape_str({n[p], k[p]})), out);
    }
    if (ck.has(K.smooth[2]))
      check_tensor(ck, layer, K.smooth[2], {{I}}, Want::Float, "the smooth vector of down_proj's input", out);
  }
  // Smooth vectors: all experts or none, per GEMM. GEMM1's are needed by every rank
  // (the dispatch sender quantises for the destination expert), so all are checked.
  std::optional<std::string> have13, have2;
  for (int64_t g = 0; g < E && (!have13 || !have2); ++g) {
    const SqKeys K = sq_keys(mk, g);
    if (!have13 && ck.has(K.smooth[1])) have13 = K.smooth[1];
    if (!have13 && ck.has(K.smooth[0])) have13 = K.smooth[0];
    if (!have2 && ck.has(K.smooth[2])) have2 = K.smooth[2];
  }
  for (int64_t g = 0; g < E && !out.full(); ++g) {
    const SqKeys K = sq_keys(mk, g);
    if (have13) {
      const bool hg = ck.has(K.smooth[0]), hu = ck.has(K.smooth[1]);
      if (!hg && !hu)
        out.add(TensorProblem::Missing, K.smooth[1],
                fmt::format("layer {}: missing smooth for expert {}: neither '{}' nor '{}' is in checkpoint {}, but "
                            "other experts have one (e.g. '{}'); expected f32/bf16/f16 [{}]",
                            layer, g, K.smooth[1], K.smooth[0], ck.dir(), *have13, H));
      for (int p = 0; p < 2; ++p)
        if (ck.has(K.smooth[p]))
          check_tensor(ck, layer, K.smooth[p], {{H}}, Want::Float, "the smooth vector of the experts' input", out);
    }
    if (have2 && !ck.has(K.smooth[2]) && g >= b && g < e)
      out.add(TensorProblem::Missing, K.smooth[2],
              fmt::format("layer {}: missing smooth for expert {}: '{}' is not in checkpoint {}, but other experts "
                          "have one (e.g. '{}'); expected f32/bf16/f16 [{}]",
                          layer, g, K.smooth[2], ck.dir(), *have2, I));
  }
}

void check_static(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, int64_t b, int64_t e, Problems& out) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const FdPatterns& P = fd_patterns(cfg.family);
  for (int64_t g = b; g < e && !out.full(); ++g) {
    const FdKeys K = fd_keys(P, layer, g);
    check_tensor(ck, layer, K.ug_w, {{H, 2 * I}}, Want::Int8, "the int8 up_gate_proj weight, Paddle layout [in, out]",
                 out);
    check_tensor(ck, layer, K.ug_ws, channel_shapes(2 * I), Want::Float,
                 fmt::format("one abs-max per output channel of '{}' {}", K.ug_w, shape_str({H, 2 * I})), out);
    check_tensor(ck, layer, K.dn_w, {{I, H}}, Want::Int8, "the int8 down_proj weight, Paddle layout [in, out]", out);
    check_tensor(ck, layer, K.dn_ws, channel_shapes(H), Want::Float,
                 fmt::format("one abs-max per output channel of '{}' {}", K.dn_w, shape_str({I, H})), out);
    check_tensor(ck, layer, K.dn_act, kScalarShapes, Want::Float, "the static activation scale of down_proj's input",
                 out);
  }
  // GEMM1's activation scale: one for all experts, needed by every rank.
  const std::string shared = fd_shared_act_key(P, layer);
  if (ck.has(shared)) {
    check_tensor(ck, layer, shared, kScalarShapes, Want::Float, "the static activation scale of the experts' input",
                 out);
    return;
  }
  const bool per_expert = !P.ug_act_expert.empty() && ck.has(fd_keys(P, layer, 0).ug_act_expert);
  if (!per_expert) {
    out.add(TensorProblem::Missing, shared,
            fmt::format("layer {}: activation scale '{}' missing from checkpoint {} (the static scale of the experts' "
                        "up_gate_proj input, one scalar for all experts; int8 expert weights '{}' need it)",
                        layer, shared, ck.dir(), fd_keys(P, layer, b < e ? b : 0).ug_w));
    return;
  }
  for (int64_t g = 0; g < E && !out.full(); ++g)
    check_tensor(ck, layer, fd_keys(P, layer, g).ug_act_expert, kScalarShapes, Want::Float,
                 "the static activation scale of the experts' input (a copy per expert)", out);
}

// ---- loading ----------------------------------------------------------------------

// `t` as f32 [numel]; every value finite and > 0, else an error naming the key.
Tensor positive_f32(const Checkpoint& ck, const Tensor& t, const std::string& key, int64_t layer, const char* what) {
  Tensor f = t.to(DType::F32).reshape({t.numel()});
  const float* v = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i)
    MOE_CHECK(std::isfinite(v[i]) && v[i] > 0.0f, "layer {}: {} '{}' in {} holds {} at index {} (must be finite and > 0)",
              layer, what, key, ck.file_of(key), v[i], i);
  return f;
}

// This rank's part of a float tensor (shape as stored, already checked), validated positive.
Tensor load_positive(const Checkpoint& ck, const std::string& key, const ShardRule& rule, int rank, int size,
                     int64_t layer, const char* what) {
  return positive_f32(ck, load_sharded(ck, key, ck.info(key).shape, rule, rank, size, DType::F32), key, layer, what);
}

float load_scalar(const Checkpoint& ck, const std::string& key, int64_t layer, const char* what) {
  return load_positive(ck, key, ShardRule::replicated(), 0, 1, layer, what).data<float>()[0];
}

// Rows of a then rows of b (same dtype and row length; 1-D tensors are one row each).
Tensor concat_rows(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.is_contiguous() ? a : a.clone(), bc = b.is_contiguous() ? b : b.clone();
  Shape s = ac.shape();
  s[0] += bc.dim(0);
  Tensor out = Tensor::empty(s, ac.dtype());
  std::memcpy(out.raw(), ac.raw(), ac.nbytes());
  std::memcpy(static_cast<char*>(out.raw()) + ac.nbytes(), bc.raw(), bc.nbytes());
  return out;
}

// int8 [r, c] -> [c, r]: Paddle's [in, out] weights to the kernels' [out, in].
Tensor transpose_i8(const Tensor& t) {
  const Tensor c = t.is_contiguous() ? t : t.clone();
  const int64_t R = c.dim(0), C = c.dim(1);
  Tensor out = Tensor::empty({C, R}, DType::I8);
  const int8_t* s = c.data<int8_t>();
  int8_t* d = out.data<int8_t>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < C; ++j) d[j * R + r] = s[r * C + j];
  return out;
}

// FastDeploy abs-max values -> the engine's steps (see quant_weights.h).
Tensor absmax_to_step(Tensor v) {
  float* p = v.data<float>();
  for (int64_t i = 0; i < v.numel(); ++i) p[i] = p[i] / 127.0f;
  return v;
}

// 1 / m for an xLLM smooth multiplier m (the engine divides by its smooth vector).
Tensor reciprocal(const Tensor& m) {
  Tensor r = Tensor::empty({m.numel()}, DType::F32);
  for (int64_t i = 0; i < m.numel(); ++i) r.data<float>()[i] = 1.0f / m.data<float>()[i];
  return r;
}

// Runs fn(le) for every local expert on the OpenMP threads; rethrows the first error.
template <class Fn>
void for_each_local_expert(int64_t n_local, Fn&& fn) {
  std::exception_ptr err;
  std::mutex mu;
#pragma omp parallel for schedule(dynamic)
  for (int64_t le = 0; le < n_local; ++le) {
    try {
      fn(le);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

void load_smoothquant(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt,
                      MoeLayerWeights& w) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const int tr = opt.tp_rank, ts = opt.tp_size;
  const MlpKeys mk = mlp_keys(cfg, layer, &ck);
  const int64_t b = w.expert_begin, n_local = w.n_local();

  // GEMM1 smooth vectors of every expert, in the engine's form (1 / xLLM's multiplier).
  bool smooth13 = false, smooth2 = false;
  for (int64_t g = 0; g < E && !(smooth13 && smooth2); ++g) {
    const SqKeys K = sq_keys(mk, g);
    smooth13 = smooth13 || ck.has(K.smooth[0]) || ck.has(K.smooth[1]);
    smooth2 = smooth2 || ck.has(K.smooth[2]);
  }
  if (smooth13) {
    w.smooth_all = Tensor::empty({E, H}, DType::F32);
    for (int64_t g = 0; g < E; ++g) {
      const SqKeys K = sq_keys(mk, g);
      const bool hu = ck.has(K.smooth[1]), hg = ck.has(K.smooth[0]);
      const std::string& key = hu ? K.smooth[1] : K.smooth[0];
      const Tensor m = load_positive(ck, key, ShardRule::replicated(), 0, 1, layer, "smooth vector");
      if (hu && hg) {
        const Tensor mg = load_positive(ck, K.smooth[0], ShardRule::replicated(), 0, 1, layer, "smooth vector");
        for (int64_t h = 0; h < H; ++h)
          MOE_CHECK(mg.data<float>()[h] == m.data<float>()[h],
                    "layer {}: '{}' and '{}' differ at index {} ({} vs {}): gate_proj and up_proj read the same "
                    "input, so expert {} needs one smooth vector for both",
                    layer, K.smooth[0], K.smooth[1], h, mg.data<float>()[h], m.data<float>()[h], g);
      }
      std::memcpy(w.smooth_all.data<float>() + g * H, reciprocal(m).raw(), H * sizeof(float));
    }
  }

  std::vector<Tensor> smooth_down(n_local);
  for_each_local_expert(n_local, [&](int64_t le) {
    const SqKeys K = sq_keys(mk, b + le);
    // MoE-TP: this rank's rows of gate/up (and their scales), its columns of down.
    const Tensor gq = load_sharded(ck, K.q[0], {I, H}, ShardRule::expert_local(0), tr, ts);
    const Tensor uq = load_sharded(ck, K.q[1], {I, H}, ShardRule::expert_local(0), tr, ts);
    const Tensor dq = load_sharded(ck, K.q[2], {H, I}, ShardRule::expert_local(1), tr, ts);
    const char* what = "per_channel_scale";
    const Tensor gs = load_positive(ck, K.scale[0], ShardRule::expert_local(0), tr, ts, layer, what);
    const Tensor us = load_positive(ck, K.scale[1], ShardRule::expert_local(0), tr, ts, layer, what);
    const Tensor ds = load_positive(ck, K.scale[2], ShardRule::replicated(), 0, 1, layer, what);
    pack_expert_q8(w.w13, le, concat_rows(gq, uq), concat_rows(gs, us));
    pack_expert_q8(w.w2, le, dq, ds);
    for (int i = 0; i < 3; ++i)  // packed: the file's pages leave the process
      release_sharded(ck, K.q[i], i < 2 ? Shape{I, H} : Shape{H, I}, ShardRule::expert_local(i < 2 ? 0 : 1), tr, ts);
    if (smooth2)
      smooth_down[le] =
          reciprocal(load_positive(ck, K.smooth[2], ShardRule::expert_local(0), tr, ts, layer, "smooth vector"));
    if (opt.progress) opt.progress->advance(gq.nbytes() + uq.nbytes() + dq.nbytes());
  });
  // set_expert_smooth allocates the table on first use: single-threaded.
  for (int64_t le = 0; le < n_local; ++le) {
    if (smooth13) set_expert_smooth(w.w13, le, w.smooth_all.slice_rows(b + le, b + le + 1).reshape({H}));
    if (smooth2) set_expert_smooth(w.w2, le, smooth_down[le]);
  }
}

void load_static(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt,
                 MoeLayerWeights& w) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const int tr = opt.tp_rank, ts = opt.tp_size;
  const FdPatterns& P = fd_patterns(cfg.family);
  const int64_t b = w.expert_begin, n_local = w.n_local();
  const char* act_what = "activation_scale";

  // GEMM1: one abs-max for all experts; per-expert copies (if any) must all equal it,
  // on every rank, or ranks would quantise a token for the same expert differently.
  const std::string shared = fd_shared_act_key(P, layer);
  const std::string first = ck.has(shared) ? shared : fd_keys(P, layer, 0).ug_act_expert;
  const float a1 = load_scalar(ck, first, layer, act_what);
  if (!P.ug_act_expert.empty())
    for (int64_t g = 0; g < E; ++g) {
      const std::string key = fd_keys(P, layer, g).ug_act_expert;
      if (!ck.has(key)) continue;
      const float v = load_scalar(ck, key, layer, act_what);
      MOE_CHECK(v == a1,
                "layer {}: '{}' is {} but '{}' is {}: the experts' up_gate_proj activation scale must be one value "
                "shared by all experts",
                layer, key, v, first, a1);
    }
  const float s1 = a1 / 127.0f;
  w.act_scale_all = Tensor::empty({E}, DType::F32);
  for (int64_t g = 0; g < E; ++g) w.act_scale_all.data<float>()[g] = s1;

  // GEMM2: one abs-max per local expert, stacked [E_l] by the scale table's loader.
  ScaleLoad sl;
  sl.layer = layer;
  sl.expert_begin = b;
  sl.expert_end = b + n_local;
  sl.activations_only = true;
  const LayerScales ls = load_layer_scales(ck, cfg, sl);
  const ScaleTensor* dn_act = n_local > 0 ? ls.find("mlp.experts.down_proj_in_scale") : nullptr;
  MOE_CHECK(n_local == 0 || (dn_act && dn_act->numel() == n_local),
            "layer {}: the experts' down_proj activation scales ('{}') must be one value per expert", layer,
            fd_keys(P, layer, b).dn_act);
  std::vector<float> s2(n_local);
  for_each_local_expert(n_local, [&](int64_t le) {
    const FdKeys K = fd_keys(P, layer, b + le);
    // Paddle [in, out]: gate_up's I slice is in dim 1 (gate block, then up block).
    const Tensor ug = load_sharded(ck, K.ug_w, {H, 2 * I}, ShardRule::expert_local(1, 2), tr, ts);
    const Tensor dn = load_sharded(ck, K.dn_w, {I, H}, ShardRule::expert_local(0), tr, ts);
    const Tensor ugs = load_positive(ck, K.ug_ws, ShardRule::expert_local(0, 2), tr, ts, layer, "weight_scale");
    const Tensor dns = load_positive(ck, K.dn_ws, ShardRule::replicated(), 0, 1, layer, "weight_scale");
    pack_expert_q8(w.w13, le, transpose_i8(ug), absmax_to_step(ugs));
    pack_expert_q8(w.w2, le, transpose_i8(dn), absmax_to_step(dns));
    release_sharded(ck, K.ug_w, {H, 2 * I}, ShardRule::expert_local(1, 2), tr, ts);  // packed: pages leave
    release_sharded(ck, K.dn_w, {I, H}, ShardRule::expert_local(0), tr, ts);
    s2[le] = dn_act->at(le) / 127.0f;
    if (opt.progress) opt.progress->advance(ug.nbytes() + dn.nbytes());
  });
  for (int64_t le = 0; le < n_local; ++le) {
    set_expert_act_scale(w.w13, le, s1);
    set_expert_act_scale(w.w2, le, s2[le]);
  }
}

}  // namespace

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::None: return "none";
    case QuantFormat::SmoothQuant: return "xLLM SmoothQuant";
    case QuantFormat::StaticW8A8: return "FastDeploy static W8A8";
  }
  return "?";
}

QuantFormat detect_quant_format(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer) {
  if (!cfg.is_moe_layer(layer)) return QuantFormat::None;
  const MlpKeys mk = mlp_keys(cfg, layer, &ck);
  const bool fd_names = fd_patterns(cfg.family).complete();
  std::string sq, fd;
  for (const std::string& key : ck.keys_with_prefix(mk.block + ".experts.")) {
    if (sq.empty() && key.ends_with(".qweight")) sq = key;
    if (fd.empty() && fd_names && key.ends_with(".up_gate_proj.weight")) fd = key;
  }
  MOE_CHECK(sq.empty() || fd.empty(),
            "layer {}: the experts mix two quantised formats in {}: xLLM SmoothQuant ('{}') and FastDeploy W8A8 ('{}')",
            layer, ck.dir(), sq, fd);
  return !sq.empty() ? QuantFormat::SmoothQuant : !fd.empty() ? QuantFormat::StaticW8A8 : QuantFormat::None;
}

bool is_quant_expert_key(const MoeConfig& cfg, const MlpKeys& keys, const std::string& key) {
  int64_t id = -1;
  for (const std::string* pat : {&keys.expert_gate, &keys.expert_up, &keys.expert_down}) {
    const std::string base = drop_suffix(*pat, ".weight");
    for (const char* suffix : kSqSuffix)
      if (match_expert_key(base + suffix, key, &id) && id < cfg.n_experts) return true;
  }
  // FastDeploy's fused int8 weight; its scales are in the family's scale table already.
  return fd_patterns(cfg.family).complete() && match_expert_key(keys.block + ".experts.{}.up_gate_proj.weight", key, &id) &&
         id < cfg.n_experts;
}

std::vector<TensorProblem> check_quant_experts(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                               QuantFormat f, int64_t expert_begin, int64_t expert_end,
                                               size_t max_problems) {
  Problems out;
  out.max = max_problems;
  if (expert_end < 0) expert_end = cfg.n_experts;
  if (f == QuantFormat::SmoothQuant) check_smoothquant(ck, cfg, layer, expert_begin, expert_end, out);
  if (f == QuantFormat::StaticW8A8) check_static(ck, cfg, layer, expert_begin, expert_end, out);
  return out.list;
}

void load_quant_experts(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt,
                        QuantFormat f, MoeLayerWeights& w) {
  MOE_CHECK(f != QuantFormat::None, "load_quant_experts: layer {} holds float experts", layer);
  MOE_CHECK(w.w13.dtype == DType::I8 && w.w2.dtype == DType::I8 && w.w13.n_experts == w.n_local(),
            "load_quant_experts: the packed experts must be allocated as i8 for {} experts", w.n_local());
  const auto problems = check_quant_experts(ck, cfg, layer, f, w.expert_begin, w.expert_end, 1);
  if (!problems.empty())
    throw_error(__FILE__, __LINE__, fmt::format("{} ({} checkpoint)", problems[0].message, quant_format_name(f)));
  if (f == QuantFormat::SmoothQuant)
    load_smoothquant(ck, cfg, layer, opt, w);
  else
    load_static(ck, cfg, layer, opt, w);
}

// ---- FastDeploy W8A8 linear layers outside the routed experts ------------------------

Int8LinearRead int8_linear_read(const Int8LinearSpec& s) {
  const std::string p = fmt::format("model.layers.{}.{}", s.layer, s.module);
  Int8LinearRead r;
  r.layer = s.layer;
  r.act_scale = s.module + ".act_scale";  // the scale table's engine name
  ShardRule w = ShardRule::replicated(), sc = ShardRule::replicated();
  const int size = s.split == Int8LinearSpec::Replicated ? 1 : s.size;
  const int rank = s.split == Int8LinearSpec::Replicated ? 0 : s.rank;
  if (s.split == Int8LinearSpec::Column) {
    w = ShardRule::column(/*dim=*/1);  // Paddle [in, out]: the output dim is dim 1
    sc = ShardRule::column(0);
  } else if (s.split == Int8LinearSpec::Row) {
    w = ShardRule::row(/*dim=*/0);  // the input dim is dim 0; every rank needs all out scales
  }
  if (s.out_len >= 0) {
    w.dim = 1;
    w = w.window(s.out_begin, s.out_len);
    sc = sc.window(s.out_begin, s.out_len);
  }
  r.weight = {p + ".weight", {s.in, s.out}, w, rank, size, s.layer, /*int8=*/true};
  r.weight_scale = {p + ".weight_scale", {s.out}, sc, s.split == Int8LinearSpec::Row ? 0 : rank,
                    s.split == Int8LinearSpec::Row ? 1 : size, s.layer};
  return r;
}

namespace {

// The checkpoint key of a layer-scope activation scale, by its engine name.
std::string act_scale_key(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const std::string& engine) {
  std::string first;
  for (const ScaleMapEntry& e : scale_map(cfg.family))
    if (e.engine == engine && e.scope == ScaleScope::Layer && e.kind == ScaleKind::Activation) {
      const std::string k = fmt::format("model.layers.{}.{}", layer, e.checkpoint);
      if (ck.has(k)) return k;
      if (first.empty()) first = k;
    }
  return first.empty() ? engine : first;
}

// The static step (abs-max / 127) of `engine` in `scales`: present and one value.
float act_step(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const LayerScales& scales,
               const std::string& engine, const std::string& weight_key) {
  const ScaleTensor* t = scales.find(engine);
  MOE_CHECK(t, "layer {}: activation scale '{}' missing from checkpoint {} (the static scale of the input of the "
            "int8 weight '{}'; expected f32/bf16/f16 [] or [1])",
            layer, act_scale_key(ck, cfg, layer, engine), ck.dir(), weight_key);
  MOE_CHECK(t->numel() == 1, "layer {}: activation scale '{}' in {} has shape {}, expected [] or [1] (one static "
            "scale for the input of '{}')",
            layer, t->key, ck.file_of(t->key), shape_str(t->valid_shape), weight_key);
  return t->at(0) / 127.0f;
}

void throw_first(const Problems& p) {
  if (!p.list.empty()) throw_error(__FILE__, __LINE__, p.list[0].message);
}

}  // namespace

PackedExperts load_int8_linear(const Checkpoint& ck, const MoeConfig& cfg, const Int8LinearRead& r,
                               const LayerScales& scales) {
  Problems pr;
  pr.max = 1;
  check_tensor(ck, r.layer, r.weight.key, {r.weight.shape}, Want::Int8, "an int8 weight, Paddle layout [in, out]", pr);
  check_tensor(ck, r.layer, r.weight_scale.key, {{r.weight.shape[1]}}, Want::Float,
               fmt::format("one abs-max per output channel of '{}' {}", r.weight.key, shape_str(r.weight.shape)), pr);
  throw_first(pr);
  const float step = act_step(ck, cfg, r.layer, scales, r.act_scale, r.weight.key);
  const TensorRead& sr = r.weight_scale;
  const Tensor q = load_sharded(ck, r.weight);  // [in_l, out_l] int8
  const Tensor ws = positive_f32(ck, load_sharded(ck, sr, DType::F32), sr.key, r.layer, "weight_scale");
  const int64_t n = q.dim(1), k = q.dim(0);
  MOE_CHECK(ws.numel() == n, "internal: '{}' gives {} scales for {} output channels", sr.key, ws.numel(), n);
  PackedExperts p = make_packed_experts(1, n, k, DType::I8, /*gated=*/false);
  pack_expert_q8(p, 0, transpose_i8(q), absmax_to_step(ws.clone()));
  set_expert_act_scale(p, 0, step);
  return p;
}

bool is_int8_gated_mlp(const Checkpoint& ck, int64_t layer, const std::string& block) {
  return is_int8_weight(ck, fmt::format("model.layers.{}.{}.up_gate_proj", layer, block));
}

std::vector<TensorRead> int8_gated_mlp_reads(int64_t layer, const std::string& block, int64_t H, int64_t I) {
  Int8LinearSpec ug{layer, block + ".up_gate_proj", H, 2 * I}, dn{layer, block + ".down_proj", I, H};
  const Int8LinearRead a = int8_linear_read(ug), b = int8_linear_read(dn);
  return {a.weight, a.weight_scale, b.weight, b.weight_scale};
}

GatedMlpWeights load_int8_gated_mlp(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const std::string& block,
                                    int64_t I) {
  const int64_t H = cfg.hidden_size;
  ScaleLoad sl;
  sl.layer = layer;
  sl.expert_begin = sl.expert_end = 0;  // no routed expert's scales
  sl.activations_only = true;
  const LayerScales scales = load_layer_scales(ck, cfg, sl);
  const Int8LinearRead ug = int8_linear_read({layer, block + ".up_gate_proj", H, 2 * I});
  const Int8LinearRead dn = int8_linear_read({layer, block + ".down_proj", I, H});
  // Packed as one linear each, then moved into the gated layout: W13's rows are gate
  // rows then up rows, as the experts' (pack_expert_q8 on a gated PackedExperts).
  const PackedExperts a = load_int8_linear(ck, cfg, ug, scales), b = load_int8_linear(ck, cfg, dn, scales);
  GatedMlpWeights w;
  w.act = cfg.act;
  w.w13 = make_packed_experts(1, 2 * I, H, DType::I8, /*gated=*/true);
  Tensor q, st;
  unpack_expert_q8(a, 0, q, st);
  pack_expert_q8(w.w13, 0, q, st);
  set_expert_act_scale(w.w13, 0, a.act_scale.data<float>()[0]);
  w.w2 = b;
  return w;
}

AttentionQuantScales load_attention_quant_scales(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                                 int64_t kv_dim, int rank, int size) {
  ScaleLoad sl;
  sl.layer = layer;
  sl.expert_begin = sl.expert_end = 0;
  sl.activations_only = true;
  const LayerScales scales = load_layer_scales(ck, cfg, sl);
  AttentionQuantScales out;
  const ScaleTensor* k = scales.find("self_attn.attn.cache_k_scale");
  const ScaleTensor* v = scales.find("self_attn.attn.cache_v_scale");
  MOE_CHECK(!k == !v, "layer {}: int8 KV cache scale '{}' is in checkpoint {} but '{}' is not (K and V are cached "
            "together: both or neither)",
            layer, k ? k->key : v->key, ck.dir(),
            act_scale_key(ck, cfg, layer, k ? "self_attn.attn.cache_v_scale" : "self_attn.attn.cache_k_scale"));
  auto steps = [&](const ScaleTensor& t) {
    const int64_t n = t.numel();
    MOE_CHECK(n == 1 || (t.valid_shape.size() == 1 && n == kv_dim),
              "layer {}: KV cache scale '{}' in {} has shape {}, expected [] or [1] (one per tensor) or [{}] (one per "
              "key/value channel)",
              layer, t.key, ck.file_of(t.key), shape_str(t.valid_shape), kv_dim);
    if (n == 1) {
      Tensor s = Tensor::empty({1}, DType::F32);
      s.data<float>()[0] = t.at(0) / 127.0f;
      return s;
    }
    const auto [b, e] = shard_range(fmt::format("KV cache scale '{}'", t.key), n, rank, size);
    Tensor s = Tensor::empty({e - b}, DType::F32);
    for (int64_t i = b; i < e; ++i) s.data<float>()[i - b] = t.at(i) / 127.0f;
    return s;
  };
  if (k) {
    out.cache_k = steps(*k);
    out.cache_v = steps(*v);
  }
  for (const char* eng : {"self_attn.attn.q_scale", "self_attn.attn.s_scale"})
    if (const ScaleTensor* t = scales.find(eng)) {
      MOE_CHECK(t->numel() == 1, "layer {}: attention matmul scale '{}' in {} has shape {}, expected [] or [1]", layer,
                t->key, ck.file_of(t->key), shape_str(t->valid_shape));
      out.has_qs = true;
    }
  return out;
}

}  // namespace moe
