#include "loader/moe_weights.h"

#include <fmt/format.h>

#include <cstring>

#include "core/check.h"

namespace moe {

namespace {

std::string expert_key(const std::string& pattern, int64_t e) {
  return fmt::format(fmt::runtime(pattern), e);
}

// Views `key`, checking that it exists and has `expected` shape; errors name the
// key, the layer, the file and both shapes.
Tensor get(const Checkpoint& ck, const std::string& key, const Shape& expected, int64_t layer) {
  MOE_CHECK(ck.has(key), "layer {}: tensor '{}' missing from checkpoint {} (expected shape {})", layer, key,
            ck.dir(), shape_str(expected));
  const TensorInfo& info = ck.info(key);
  MOE_CHECK(info.shape == expected, "layer {}: tensor '{}' in {} has shape {}, expected {}", layer, key,
            ck.file_of(key), shape_str(info.shape), shape_str(expected));
  MOE_CHECK(info.dtype == DType::F32 || info.dtype == DType::BF16 || info.dtype == DType::F16,
            "layer {}: tensor '{}' in {} has dtype {}, expected f32, bf16 or f16", layer, key, ck.file_of(key),
            dtype_name(info.dtype));
  return ck.view(key);
}

Tensor get_f32(const Checkpoint& ck, const std::string& key, const Shape& expected, int64_t layer) {
  return get(ck, key, expected, layer).to(DType::F32);
}

// Columns [c0, c1) of a 2-D tensor, as a contiguous copy.
Tensor columns(const Tensor& t, int64_t c0, int64_t c1) {
  if (c0 == 0 && c1 == t.dim(1)) return t;
  const int64_t rows = t.dim(0), cols = t.dim(1), es = static_cast<int64_t>(dtype_size(t.dtype()));
  Tensor out = Tensor::empty({rows, c1 - c0}, t.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * (c1 - c0) * es,
                static_cast<const char*>(t.raw()) + (r * cols + c0) * es, (c1 - c0) * es);
  return out;
}

// Rows [0, a) from `top` and [0, b) from `bottom`, stacked: the W13 of one expert.
Tensor stack_rows(const Tensor& top, const Tensor& bottom) {
  MOE_CHECK(top.dtype() == bottom.dtype(), "gate and up projections have different dtypes ({} vs {})",
            dtype_name(top.dtype()), dtype_name(bottom.dtype()));
  Tensor out = Tensor::empty({top.dim(0) + bottom.dim(0), top.dim(1)}, top.dtype());
  std::memcpy(out.raw(), top.raw(), top.nbytes());
  std::memcpy(static_cast<char*>(out.raw()) + top.nbytes(), bottom.raw(), bottom.nbytes());
  return out;
}

GatedMlpWeights load_gated_mlp(const Checkpoint& ck, const std::string& prefix, int64_t H, int64_t I,
                               Activation act, DType compute, int64_t layer) {
  GatedMlpWeights w;
  w.act = act;
  w.w13 = make_packed_experts(1, 2 * I, H, compute, /*gated=*/true);
  w.w2 = make_packed_experts(1, H, I, compute, /*gated=*/false);
  pack_expert(w.w13, 0,
              stack_rows(get(ck, prefix + ".gate_proj.weight", {I, H}, layer),
                         get(ck, prefix + ".up_proj.weight", {I, H}, layer)));
  pack_expert(w.w2, 0, get(ck, prefix + ".down_proj.weight", {H, I}, layer));
  return w;
}

}  // namespace

MlpKeys mlp_keys(const MoeConfig& cfg, int64_t layer, const Checkpoint* ck) {
  MlpKeys k;
  const std::string base = fmt::format("model.layers.{}", layer);
  // Mixtral checkpoints on the Hub name the block "block_sparse_moe"; transformers'
  // stacked-expert layout names it "mlp" like every other family.
  const bool mixtral_hub = cfg.family == Family::Mixtral && !(ck && !ck->has(base + ".block_sparse_moe.gate.weight") &&
                                                              ck->has(base + ".mlp.gate.weight"));
  k.block = base + (mixtral_hub ? ".block_sparse_moe" : ".mlp");
  k.router = k.block + ".gate.weight";
  k.fused_gate_up = k.block + ".experts.gate_up_proj";
  k.fused_down = k.block + ".experts.down_proj";
  k.dense_prefix = base + ".mlp";
  if (cfg.family == Family::Mixtral) {
    k.expert_gate = k.block + ".experts.{}.w1.weight";
    k.expert_up = k.block + ".experts.{}.w3.weight";
    k.expert_down = k.block + ".experts.{}.w2.weight";
  } else {
    k.expert_gate = k.block + ".experts.{}.gate_proj.weight";
    k.expert_up = k.block + ".experts.{}.up_proj.weight";
    k.expert_down = k.block + ".experts.{}.down_proj.weight";
  }
  switch (cfg.family) {
    case Family::Qwen2Moe:
      k.shared_prefix = k.block + ".shared_expert";
      k.shared_gate = k.block + ".shared_expert_gate.weight";
      break;
    case Family::DeepseekV2:
    case Family::DeepseekV3:
      k.shared_prefix = k.block + ".shared_experts";
      k.correction_bias = k.block + ".gate.e_score_correction_bias";
      break;
    case Family::Ernie45Moe:
      k.shared_prefix = k.block + ".shared_experts";
      k.correction_bias = k.block + ".moe_statics.e_score_correction_bias";
      break;
    default: break;
  }
  return k;
}

MoeLayerWeights load_moe_layer(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                               const MlpLoadOptions& opt) {
  MOE_CHECK(layer >= 0 && layer < cfg.n_layers, "layer {} out of range: the model has {} layers", layer,
            cfg.n_layers);
  MOE_CHECK(cfg.is_moe_layer(layer), "layer {} of this {} model has a dense MLP, not a MoE block", layer,
            cfg.model_type);
  MOE_CHECK(opt.compute == DType::F32 || opt.compute == DType::BF16, "compute dtype must be f32 or bf16, got {}",
            dtype_name(opt.compute));
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const MlpKeys keys = mlp_keys(cfg, layer, &ck);
  MoeLayerWeights w;
  w.expert_begin = opt.expert_begin;
  w.expert_end = opt.expert_end < 0 ? E : opt.expert_end;
  MOE_CHECK(0 <= w.expert_begin && w.expert_begin <= w.expert_end && w.expert_end <= E,
            "expert range [{}, {}) outside [0, {})", w.expert_begin, w.expert_end, E);

  w.gate = make_packed_experts(1, E, H, DType::F32, false);
  pack_expert(w.gate, 0, get(ck, keys.router, {E, H}, layer));
  if (cfg.routing.use_correction_bias) {
    MOE_CHECK(ck.has(keys.correction_bias), "layer {}: tensor '{}' missing from checkpoint {} (expected shape [{}])",
              layer, keys.correction_bias, ck.dir(), E);
    const Shape bias_shape = ck.info(keys.correction_bias).shape;
    const Shape want = bias_shape.size() == 2 ? Shape{1, E} : Shape{E};  // ERNIE stores [1, E]
    w.correction_bias = get_f32(ck, keys.correction_bias, want, layer).reshape({E});
  }

  const int64_t n_local = w.n_local();
  MOE_CHECK(opt.tp_size >= 1 && opt.tp_rank >= 0 && opt.tp_rank < opt.tp_size, "bad MoE-TP rank {} of {}",
            opt.tp_rank, opt.tp_size);
  MOE_CHECK(I % opt.tp_size == 0, "--tp {} does not divide the experts' moe_intermediate_size {} (layer {})",
            opt.tp_size, I, layer);
  const int64_t Il = I / opt.tp_size, i0 = opt.tp_rank * Il, i1 = i0 + Il;
  w.w13 = make_packed_experts(n_local, 2 * Il, H, opt.compute, /*gated=*/true);
  w.w2 = make_packed_experts(n_local, H, Il, opt.compute, /*gated=*/false);
  const bool fused = !ck.has(expert_key(keys.expert_gate, w.expert_begin)) && ck.has(keys.fused_gate_up);
  if (fused) {
    // Stacked layout: slice this rank's experts out of the [E, ...] tensors.
    const Tensor gu = get(ck, keys.fused_gate_up, {E, 2 * I, H}, layer);
    const Tensor dn = get(ck, keys.fused_down, {E, H, I}, layer);
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = 0; e < n_local; ++e) {
      const int64_t g = w.expert_begin + e;
      const Tensor gu_e = gu.slice_rows(g, g + 1).reshape({2 * I, H});
      pack_expert(w.w13, e,
                  opt.tp_size == 1 ? gu_e : stack_rows(gu_e.slice_rows(i0, i1), gu_e.slice_rows(I + i0, I + i1)));
      pack_expert(w.w2, e, columns(dn.slice_rows(g, g + 1).reshape({H, I}), i0, i1));
    }
  } else {
    // Look every key up first so a missing expert is reported before any work.
    std::vector<Tensor> gate(n_local), up(n_local), down(n_local);
    for (int64_t e = 0; e < n_local; ++e) {
      const int64_t g = w.expert_begin + e;
      gate[e] = get(ck, expert_key(keys.expert_gate, g), {I, H}, layer);
      up[e] = get(ck, expert_key(keys.expert_up, g), {I, H}, layer);
      down[e] = get(ck, expert_key(keys.expert_down, g), {H, I}, layer);
    }
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = 0; e < n_local; ++e) {
      pack_expert(w.w13, e, stack_rows(gate[e].slice_rows(i0, i1), up[e].slice_rows(i0, i1)));
      pack_expert(w.w2, e, columns(down[e], i0, i1));
    }
  }

  if (cfg.shared_intermediate_size > 0) {
    w.shared = load_gated_mlp(ck, keys.shared_prefix, H, cfg.shared_intermediate_size, cfg.act, opt.compute, layer);
    if (cfg.shared_expert_gate) w.shared_gate = get_f32(ck, keys.shared_gate, {1, H}, layer).reshape({H});
  }
  return w;
}

GatedMlpWeights load_dense_mlp(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, DType compute) {
  MOE_CHECK(layer >= 0 && layer < cfg.n_layers, "layer {} out of range: the model has {} layers", layer,
            cfg.n_layers);
  MOE_CHECK(!cfg.is_moe_layer(layer), "layer {} has a MoE block, not a dense MLP", layer);
  MOE_CHECK(cfg.dense_intermediate_size > 0, "config.json: layer {} is dense but 'intermediate_size' is missing",
            layer);
  return load_gated_mlp(ck, mlp_keys(cfg, layer, &ck).dense_prefix, cfg.hidden_size, cfg.dense_intermediate_size,
                        cfg.act, compute, layer);
}

}  // namespace moe
