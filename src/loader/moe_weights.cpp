#include "loader/moe_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "loader/gguf/gguf_experts.h"
#include "loader/hf_int4/hf_int4.h"
#include "kernels/quant.h"
#include "loader/fp8_weights.h"
#include "loader/quant_config.h"
#include "loader/quant_weights.h"
#include "loader/scales.h"
#include "loader/weights_cache/weight_records.h"

namespace moe {

namespace {

std::string expert_key(const std::string& pattern, int64_t e) {
  return fmt::format(fmt::runtime(pattern), e);
}

}  // namespace

std::optional<TensorProblem> tensor_problem(const Checkpoint& ck, const std::string& key, const Shape& expected,
                                            int64_t layer, bool fp8_ok) {
  const std::string where = layer >= 0 ? fmt::format("layer {}: ", layer) : "";
  if (hf_int4::is_int4_weight(ck, key)) {  // GPTQ / AWQ / compressed-tensors int4 (loader/hf_int4)
    if (auto m = hf_int4::int4_problem(ck, TensorRead{key, expected, ShardRule::replicated(), 0, 1, layer}))
      return TensorProblem{TensorProblem::WrongDType, key, where + *m};
    return std::nullopt;
  }
  if (!ck.has(key))
    return TensorProblem{TensorProblem::Missing, key,
                         fmt::format("{}tensor '{}' missing from checkpoint {} (expected shape {})", where, key,
                                     ck.dir(), shape_str(expected))};
  const TensorInfo& info = ck.info(key);  // opens the shard: a broken one throws, naming it
  if (info.shape != expected)
    return TensorProblem{TensorProblem::WrongShape, key,
                         fmt::format("{}tensor '{}' in {} has shape {}, expected {}", where, key, ck.file_of(key),
                                     shape_str(info.shape), shape_str(expected))};
  if (fp8_ok && info.dtype == DType::F8E4M3) {  // block-scaled FP8 (loader/fp8_weights.h)
    if (auto p = fp8_problem(ck, TensorRead{key, expected, ShardRule::replicated(), 0, 1, layer}))
      return TensorProblem{TensorProblem::WrongDType, key, where + *p};
    return std::nullopt;
  }
  if (!is_float_weight(info.dtype))
    return TensorProblem{TensorProblem::WrongDType, key,
                         fmt::format("{}tensor '{}' in {} has dtype {}, expected f32, bf16 or f16{}", where, key,
                                     ck.file_of(key), dtype_name(info.dtype),
                                     fp8_ok ? " (or f8_e4m3 with block scales)" : "")};
  return std::nullopt;
}

namespace {

void check_or_throw(const Checkpoint& ck, const std::string& key, const Shape& expected, int64_t layer) {
  if (auto p = tensor_problem(ck, key, expected, layer)) throw_error(__FILE__, __LINE__, p->message);
}

// tensor_problem of a read; an int8 read's weight may (and will, load_int8_linear checks)
// be i8.
std::optional<TensorProblem> read_problem(const Checkpoint& ck, const LayerRead& r, int64_t layer) {
  auto p = tensor_problem(ck, r.key, r.full_shape, layer);
  if (p && p->kind == TensorProblem::WrongDType && r.int8 && ck.info(r.key).dtype == DType::I8) return std::nullopt;
  return p;
}

void check_read_or_throw(const Checkpoint& ck, const LayerRead& r, int64_t layer) {
  if (auto p = read_problem(ck, r, layer)) throw_error(__FILE__, __LINE__, p->message);
}

// Shared experts split over MoE-TP would need an all-reduce the MoE block does not run.
void check_shared_whole(const LayerRead& r, int64_t layer) {
  MOE_CHECK(r.rule.kind == ShardKind::Replicated || r.size == 1,
            "layer {}: shared expert tensor '{}' would be split over {} MoE-TP ranks ({}), but the MoE block runs the "
            "shared experts sequence-parallel, whole on every rank (loader/shard.h moe_replicated_whitelist)",
            layer, r.key, r.size, r.rule.describe());
}

Shape bias_shape(const Checkpoint& ck, const std::string& key, int64_t E) {
  // ERNIE stores the correction bias as [1, E]; the others as [E].
  return ck.has(key) && ck.info(key).shape.size() == 2 ? Shape{1, E} : Shape{E};
}

bool uses_fused(const Checkpoint& ck, const MlpKeys& keys) {
  return !ck.has(expert_key(keys.expert_gate, 0)) && ck.has(keys.fused_gate_up);
}

// FP8 with f32 compute (and the router/other single tensors): dequantised at load, one
// tensor at a time, exactly (the f32 products), then to the requested dtype. Routed,
// shared and dense experts computed in bf16 stay e4m3 instead (fp8_weights.h).
Tensor load_read(const Checkpoint& ck, const LayerRead& r, std::optional<DType> out = std::nullopt) {
  if (hf_int4::is_int4_weight(ck, r.key)) {  // int4 read as float: (u - z) * s, exact in f32
    const Tensor d = hf_int4::dequantize(ck, r.tensor_read());
    return out ? d.to(*out) : d;
  }
  if (is_fp8_weight(ck, r.key)) {
    const Tensor d = dequantize_fp8(load_fp8_slice(ck, r.tensor_read()), DType::F32);
    return out ? d.to(*out) : d;
  }
  return load_sharded(ck, r.key, r.full_shape, r.rule, r.rank, r.size, out);
}

void warn_default(const std::string& msg) { fmt::print(stderr, "moe-ep: warning: {}\n", msg); }

// Reports unexpected tensors: an error when strict, else one warning.
void report_unexpected(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt) {
  const auto extra = unexpected_mlp_tensors(ck, cfg, layer);
  if (extra.empty()) return;
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + ("'" + extra[i] + "'");
  if (extra.size() > 8) list += fmt::format(", ... ({} in all)", extra.size());
  const std::string msg =
      fmt::format("layer {}: {} unexpected tensor{} in {} (not used by the {} name map): {}", layer, extra.size(),
                  extra.size() == 1 ? "" : "s", ck.dir(), cfg.model_type, list);
  MOE_CHECK(!opt.strict, "{} (--strict)", msg);
  (opt.warn ? opt.warn : warn_default)(msg);
}

// The layer's int8 expert format: none for an int4 checkpoint, whose GPTQ / AWQ
// "qweight" keys are not xLLM SmoothQuant's.
QuantFormat layer_quant_format(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer) {
  return hf_int4::checkpoint_int4(ck) ? QuantFormat::None : detect_quant_format(ck, cfg, layer);
}

// Loads and packs the gated MLP of `reads` (gate, up, down in that order). int4: a
// GPTQ / AWQ / compressed-tensors MLP stays int4 (loader/hf_int4), a GGUF one of integer-
// coded types stays in its codes (loader/gguf/gguf_experts.h).
GatedMlpWeights load_gated(const Checkpoint& ck, const LayerRead& g, const LayerRead& u, const LayerRead& d,
                           Activation act, DType compute, bool int4 = true) {
  // This rank's rows of gate/up (a column-parallel slice under --attn-tp).
  const int64_t I = g.rule.kind == ShardKind::Column ? g.full_shape[0] / g.size : g.full_shape[0], H = g.full_shape[1];
  GatedMlpWeights w;
  w.act = act;
  if (int4 && hf_int4::is_int4_weight(ck, g.key)) {
    // Act-order (no exact int4 slice): int4 with its inputs and neurons reordered where
    // an order keeps every group whole (hf_int4::expert_act_order), else dequantised below.
    const bool exact = hf_int4::int4_exact(ck, g.tensor_read()) && hf_int4::int4_exact(ck, u.tensor_read()) &&
                       hf_int4::int4_exact(ck, d.tensor_read());
    const auto orders =
        exact ? std::nullopt : hf_int4::expert_act_order(ck, g.tensor_read(), u.tensor_read(), d.tensor_read());
    if (exact || orders) {
      const int64_t group = hf_int4::kernel_group(ck);
      w.w13 = make_packed_experts_int4(1, 2 * I, H, /*gated=*/true, group);
      w.w2 = make_packed_experts_int4(1, H, I, /*gated=*/false, group);
      if (orders) w.w13.in_perm = Tensor::empty({1, H}, DType::I32);
      hf_int4::pack_expert(ck, w.w13, w.w2, 0, g.tensor_read(), u.tensor_read(), d.tensor_read(),
                           orders ? &*orders : nullptr);
      return w;
    }
  }
  const TensorRead gr = g.tensor_read(), ur = u.tensor_read(), dr = d.tensor_read();
  if (int4 && gguf::is_coded(ck, gr) && gguf::is_coded(ck, ur) && gguf::is_coded(ck, dr)) {  // GGUF codes as stored
    w.w13 = make_packed_experts_coded(1, 2 * I, H, /*gated=*/true, gguf::common_format(ck, {&gr, &ur}));
    w.w2 = make_packed_experts_coded(1, H, I, /*gated=*/false, gguf::common_format(ck, {&dr}));
    gguf::pack_expert(ck, w.w13, w.w2, 0, gr, ur, dr);
    for (const TensorRead* r : {&gr, &ur, &dr}) release_sharded(ck, *r);
    return w;
  }
  if (compute == DType::BF16 && is_fp8_weight(ck, g.key)) {  // stays e4m3 (fp8_weights.h)
    const Fp8Slice gs = load_fp8_slice(ck, g.tensor_read()), us = load_fp8_slice(ck, u.tensor_read()),
                   ds = load_fp8_slice(ck, d.tensor_read());
    w.w13 = make_packed_fp8(1, 2 * I, H, /*gated=*/true, gs.block_k);
    w.w2 = make_packed_fp8(1, H, I, /*gated=*/false, ds.block_k);
    pack_fp8_gated(w.w13, 0, gs, us);
    pack_fp8(w.w2, 0, ds);
    for (const LayerRead* r : {&g, &u, &d}) release_sharded(ck, r->tensor_read());  // packed: held once
    return w;
  }
  w.w13 = make_packed_experts(1, 2 * I, H, compute, /*gated=*/true);
  w.w2 = make_packed_experts(1, H, I, compute, /*gated=*/false);
  pack_expert_gated(w.w13, 0, load_read(ck, g), load_read(ck, u));
  pack_expert(w.w2, 0, load_read(ck, d));
  for (const LayerRead* r : {&g, &u, &d}) release_sharded(ck, r->tensor_read());  // packed: held once
  return w;
}


}  // namespace

bool match_expert_key(const std::string& pattern, const std::string& key, int64_t* id) {
  const size_t ph = pattern.find("{}");
  if (ph == std::string::npos) return false;
  const std::string head = pattern.substr(0, ph), tail = pattern.substr(ph + 2);
  if (key.size() <= head.size() + tail.size() || !key.starts_with(head) || !key.ends_with(tail)) return false;
  const std::string num = key.substr(head.size(), key.size() - head.size() - tail.size());
  if (num.empty() || num.size() > 12 || (num.size() > 1 && num[0] == '0')) return false;
  int64_t v = 0;
  for (char c : num) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *id = v;
  return true;
}

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

std::vector<LayerRead> mlp_layer_reads(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                       const MlpLoadOptions& opt) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const MlpKeys keys = mlp_keys(cfg, layer, &ck);
  std::vector<LayerRead> r;
  auto add = [&](std::string key, Shape shape, ShardRule rule, LayerRead::Role role, int64_t expert = -1, int rank = 0,
                 int size = 1) {
    r.push_back({std::move(key), std::move(shape), rule, rank, size, role, expert});
  };
  const int tr = opt.tp_rank, ts = opt.tp_size;
  // A gated MLP: float gate/up/down [out, in], or FastDeploy's int8 up_gate/down [in, out]
  // with their weight scales. `tp`: the shared experts' TP rules through the whitelist.
  auto gated = [&](const std::string& prefix, int64_t Im, LayerRead::Role role, bool tp) {
    const std::string rel = prefix.substr(fmt::format("model.layers.{}.", layer).size());
    // Under --attn-tp the MLP is split over the attention-TP group (MlpLoadOptions).
    const bool split_mlp = opt.mlp_tp_size > 1;
    if (split_mlp) {
      MOE_CHECK(opt.tp_size == 1, "internal: an MLP split over attention TP with MoE-TP {}", opt.tp_size);
      MOE_CHECK(!is_int8_gated_mlp(ck, layer, rel),
                "layer {}: '{}' is a FastDeploy int8 MLP ([in, out] weights, one scale per output channel), which "
                "--attn-tp cannot split over ranks yet; run it with --attn-tp 1",
                layer, prefix);
      MOE_CHECK(Im % opt.mlp_tp_size == 0,
                "--attn-tp {} does not divide the intermediate size {} of '{}' (layer {}): its rows are split over "
                "the attention-TP ranks",
                opt.mlp_tp_size, Im, prefix, layer);
    }
    if (is_int8_gated_mlp(ck, layer, rel)) {
      for (const TensorRead& t : int8_gated_mlp_reads(layer, rel, H, Im)) {
        add(t.key, t.shape, t.rule, role);
        r.back().int8 = t.key.ends_with(".weight");
      }
      return;
    }
    auto rule = [&](const std::string& key, ShardRule split) {
      const Shape shape = key.ends_with("down_proj.weight") ? Shape{H, Im} : Shape{Im, H};
      if (split_mlp) return add(key, shape, split, role, -1, opt.mlp_tp_rank, opt.mlp_tp_size);
      const ShardRule ru = tp ? apply_whitelist(key, split, moe_replicated_whitelist()) : ShardRule::replicated();
      add(key, shape, ru, role, -1, ru.kind == ShardKind::Replicated ? 0 : tr, ru.kind == ShardKind::Replicated ? 1 : ts);
    };
    rule(prefix + ".gate_proj.weight", ShardRule::column());
    rule(prefix + ".up_proj.weight", ShardRule::column());
    rule(prefix + ".down_proj.weight", ShardRule::row());
  };
  if (!cfg.is_moe_layer(layer)) {
    gated(keys.dense_prefix, cfg.dense_intermediate_size, LayerRead::Dense, false);
    return r;
  }
  const int64_t b = opt.expert_begin, e = opt.expert_end < 0 ? E : opt.expert_end;
  add(keys.router, {E, H}, ShardRule::replicated(), LayerRead::Router);
  if (cfg.routing.use_correction_bias)
    add(keys.correction_bias, bias_shape(ck, keys.correction_bias, E), ShardRule::replicated(), LayerRead::Bias);
  if (layer_quant_format(ck, cfg, layer) != QuantFormat::None) {
    // Pre-quantised int8 experts: read by load_quant_experts (loader/quant_weights.h).
  } else if (uses_fused(ck, keys)) {
    add(keys.fused_gate_up, {E, 2 * I, H}, ShardRule::expert_local_stacked(b, e, 0, 2), LayerRead::FusedGateUp, -1, tr,
        ts);
    add(keys.fused_down, {E, H, I}, ShardRule::expert_local_stacked(b, e, 1), LayerRead::FusedDown, -1, tr, ts);
  } else {
    for (int64_t g = b; g < e; ++g) {
      add(expert_key(keys.expert_gate, g), {I, H}, ShardRule::expert_local(0), LayerRead::ExpertGate, g, tr, ts);
      add(expert_key(keys.expert_up, g), {I, H}, ShardRule::expert_local(0), LayerRead::ExpertUp, g, tr, ts);
      add(expert_key(keys.expert_down, g), {H, I}, ShardRule::expert_local(1), LayerRead::ExpertDown, g, tr, ts);
    }
  }
  if (cfg.shared_intermediate_size > 0) {
    gated(keys.shared_prefix, cfg.shared_intermediate_size, LayerRead::Shared, true);
    if (cfg.shared_expert_gate) {
      // [1, H]: one gate logit per token, which scales every rank's partial alike.
      const ShardRule ru = opt.mlp_tp_size > 1
                               ? ShardRule::replicated()
                               : apply_whitelist(keys.shared_gate, ShardRule::column(), moe_replicated_whitelist());
      add(keys.shared_gate, {1, H}, ru, LayerRead::SharedGate, -1, ru.kind == ShardKind::Replicated ? 0 : tr,
          ru.kind == ShardKind::Replicated ? 1 : ts);
    }
  }
  return r;
}

uint64_t mlp_layer_read_bytes(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt) {
  uint64_t n = 0;
  for (const LayerRead& r : mlp_layer_reads(ck, cfg, layer, opt)) n += read_bytes(ck, r.tensor_read());
  return n;
}

std::vector<TensorProblem> check_mlp_block(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                           size_t max_problems) {
  std::vector<TensorProblem> out;
  if (cfg.is_moe_layer(layer)) {
    // The router first: its shape [E, H] must be in the file, which bounds E before
    // the experts are enumerated.
    const MlpKeys keys = mlp_keys(cfg, layer, &ck);
    if (auto p = tensor_problem(ck, keys.router, {cfg.n_experts, cfg.hidden_size}, layer)) {
      out.push_back(*p);
      return out;
    }
  } else if (cfg.dense_intermediate_size <= 0) {
    out.push_back({TensorProblem::Missing, fmt::format("model.layers.{}.mlp", layer),
                   fmt::format("config.json: layer {} is dense but 'intermediate_size' is missing", layer)});
    return out;
  }
  if (cfg.is_moe_layer(layer)) {
    try {
      const QuantFormat qf = layer_quant_format(ck, cfg, layer);
      for (auto& p : check_quant_experts(ck, cfg, layer, qf, 0, cfg.n_experts, max_problems)) out.push_back(p);
    } catch (const Error& e) {  // keys of two quantised formats
      out.push_back({TensorProblem::Unexpected, mlp_keys(cfg, layer, &ck).block, e.what()});
      return out;
    }
  }
  for (const LayerRead& r : mlp_layer_reads(ck, cfg, layer, {})) {
    if (out.size() >= max_problems) break;
    if (auto p = read_problem(ck, r, layer)) out.push_back(*p);
  }
  return out;
}

std::vector<std::string> mlp_block_prefixes(int64_t layer) {
  const std::string base = fmt::format("model.layers.{}", layer);
  return {base + ".mlp.", base + ".block_sparse_moe."};
}

std::vector<std::string> unexpected_mlp_tensors(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer) {
  const MlpKeys keys = mlp_keys(cfg, layer, &ck);
  const bool moe = cfg.is_moe_layer(layer);
  std::vector<std::string> known;
  auto gated = [&](const std::string& p) {
    // float gate/up/down, or FastDeploy's int8 up_gate_proj (scales: the scale table)
    for (const char* m : {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight", ".up_gate_proj.weight"})
      known.push_back(p + m);
  };
  if (moe) {
    known.push_back(keys.router);
    if (cfg.routing.use_correction_bias) known.push_back(keys.correction_bias);
    known.push_back(keys.fused_gate_up);
    known.push_back(keys.fused_down);
    known.push_back(keys.fused_gate_up + "_scale_inv");  // FP8 stacked experts (fp8_weights.h)
    known.push_back(keys.fused_down + "_scale_inv");
    if (cfg.shared_intermediate_size > 0) {
      gated(keys.shared_prefix);
      if (cfg.shared_expert_gate) known.push_back(keys.shared_gate);
    }
  } else {
    gated(keys.dense_prefix);
  }
  std::vector<std::string> out;
  for (const std::string& prefix : mlp_block_prefixes(layer))
    for (const std::string& stored : ck.keys_with_prefix(prefix)) {
      // An int4 weight's tensors (loader/hf_int4) stand for "<module>.weight".
      const std::string key = hf_int4::is_int4_key(stored) ? hf_int4::weight_key_of(stored) : stored;
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      int64_t id = -1;
      if (moe && (match_expert_key(keys.expert_gate, key, &id) || match_expert_key(keys.expert_up, key, &id) ||
                  match_expert_key(keys.expert_down, key, &id)) &&
          id < cfg.n_experts)
        continue;
      if (auto m = match_scale_key(cfg.family, key); m && m->layer == layer) continue;
      if (moe && is_quant_expert_key(cfg, keys, key)) continue;
      out.push_back(stored);
    }
  return out;
}

// The loads themselves, without the cache (defined below).
MoeLayerWeights load_moe_layer_packed(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                      const MlpLoadOptions& opt);
GatedMlpWeights load_dense_mlp_packed(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                      const MlpLoadOptions& opt);

namespace {

// What a weights-cache record of this layer's MLP block depends on besides the
// checkpoint and the model options the cache file is keyed by: every tensor the load
// reads (key, shape, shard rule and group) and the options that shape the packing.
std::string mlp_cache_key(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt,
                          uint64_t* expert_bytes) {
  std::string key = fmt::format(
      "mlp layer {}: compute {} w8a8 {} w4a8 {} group {} keep-codes {} experts [{}, {}) tp {}/{} mlp-tp {}/{}", layer,
      dtype_name(opt.compute), opt.quantize_w8a8, opt.quantize_w4a8, opt.int4_group, opt.gguf_q4_0_as_int4,
      opt.expert_begin, opt.expert_end, opt.tp_rank, opt.tp_size, opt.mlp_tp_rank, opt.mlp_tp_size);
  *expert_bytes = 0;
  for (const LayerRead& r : mlp_layer_reads(ck, cfg, layer, opt)) {
    TensorRead tr = r.tensor_read();
    tr.int8 = r.int8;
    key += "; " + describe(tr);
    if (r.expert >= 0 || r.role == LayerRead::FusedGateUp || r.role == LayerRead::FusedDown)
      *expert_bytes += read_bytes(ck, r.tensor_read());
  }
  return key;
}

}  // namespace

MoeLayerWeights load_moe_layer(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                               const MlpLoadOptions& opt) {
  if (!opt.cache) return load_moe_layer_packed(ck, cfg, layer, opt);
  uint64_t expert_bytes = 0;
  const std::string key = mlp_cache_key(ck, cfg, layer, opt, &expert_bytes);
  const int64_t begin = opt.expert_begin, end = opt.expert_end < 0 ? cfg.n_experts : opt.expert_end;
  return cached_load<MoeLayerWeights>(
      opt.cache, key, [&] { return load_moe_layer_packed(ck, cfg, layer, opt); }, encode_moe_layer,
      [&](const CacheRecord& r) {
        MoeLayerWeights w = decode_moe_layer(r, cfg, begin, end);
        if (opt.progress) opt.progress->advance(expert_bytes);  // as the packing loop would
        return w;
      });
}

MoeLayerWeights load_moe_layer_packed(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                      const MlpLoadOptions& opt) {
  MOE_CHECK(layer >= 0 && layer < cfg.n_layers, "layer {} out of range: the model has {} layers", layer,
            cfg.n_layers);
  MOE_CHECK(cfg.is_moe_layer(layer), "layer {} of this {} model has a dense MLP, not a MoE block", layer,
            cfg.model_type);
  MOE_CHECK(opt.compute == DType::F32 || opt.compute == DType::BF16, "compute dtype must be f32 or bf16, got {}",
            dtype_name(opt.compute));
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  MoeLayerWeights w;
  w.expert_begin = opt.expert_begin;
  w.expert_end = opt.expert_end < 0 ? E : opt.expert_end;
  MOE_CHECK(0 <= w.expert_begin && w.expert_begin <= w.expert_end && w.expert_end <= E,
            "expert range [{}, {}) outside [0, {})", w.expert_begin, w.expert_end, E);
  MOE_CHECK(opt.tp_size >= 1 && opt.tp_rank >= 0 && opt.tp_rank < opt.tp_size, "bad MoE-TP rank {} of {}",
            opt.tp_rank, opt.tp_size);
  MOE_CHECK(I % opt.tp_size == 0, "--tp {} does not divide the experts' moe_intermediate_size {} (layer {})",
            opt.tp_size, I, layer);

  // 1. Check every tensor this rank reads (headers only) before allocating anything:
  //    the router first, which bounds E by what the file holds.
  check_or_throw(ck, mlp_keys(cfg, layer, &ck).router, {E, H}, layer);
  report_unexpected(ck, cfg, layer, opt);
  const std::vector<LayerRead> reads = mlp_layer_reads(ck, cfg, layer, opt);
  for (const LayerRead& r : reads) check_read_or_throw(ck, r, layer);
  const QuantFormat qf = layer_quant_format(ck, cfg, layer);  // int8 experts in the file
  for (const TensorProblem& p : check_quant_experts(ck, cfg, layer, qf, w.expert_begin, w.expert_end, 1))
    throw_error(__FILE__, __LINE__, p.message);
  // Let the disk read this rank's whole share ahead of the copies (cold page cache).
  for (const LayerRead& r : reads) prefetch_sharded(ck, r.key, r.full_shape, r.rule, r.rank, r.size);

  // 2. Load, each tensor through its rule.
  const int64_t n_local = w.n_local();
  const int64_t Il = I / opt.tp_size;
  std::vector<const LayerRead*> gate(n_local), up(n_local), down(n_local);
  const LayerRead *fused_gu = nullptr, *fused_dn = nullptr, *bias = nullptr, *sgate = nullptr;
  std::vector<const LayerRead*> shared;
  for (const LayerRead& r : reads) {
    switch (r.role) {
      case LayerRead::Router: w.gate = make_packed_experts(1, E, H, DType::F32, false);
                              pack_expert(w.gate, 0, load_read(ck, r));
                              release_sharded(ck, r.tensor_read());
                              break;
      case LayerRead::Bias: bias = &r; break;
      case LayerRead::ExpertGate: gate[r.expert - w.expert_begin] = &r; break;
      case LayerRead::ExpertUp: up[r.expert - w.expert_begin] = &r; break;
      case LayerRead::ExpertDown: down[r.expert - w.expert_begin] = &r; break;
      case LayerRead::FusedGateUp: fused_gu = &r; break;
      case LayerRead::FusedDown: fused_dn = &r; break;
      case LayerRead::Shared: if (opt.mlp_tp_size == 1) check_shared_whole(r, layer);
                              shared.push_back(&r);
                              break;
      case LayerRead::SharedGate: check_shared_whole(r, layer); sgate = &r; break;
      case LayerRead::Dense: break;
    }
  }
  if (bias) w.correction_bias = load_read(ck, *bias, DType::F32).reshape({E});

  if (opt.quantize_w4a8) {
    MOE_CHECK(!opt.quantize_w8a8, "--quantize: w4a8 and w8a8 exclude each other");
    MOE_CHECK(qf == QuantFormat::None,
              "--quantize w4a8 quantises float experts, but layer {} holds int8 (pre-quantised) experts",
              layer);
    MOE_CHECK(valid_int4_group(opt.int4_group), "--int4-group must be 32, 64 or 128, got {}", opt.int4_group);
  }
  // GGUF integer-coded experts (per-expert keys: gguf_checkpoint.h presents them so) stay
  // as stored, 4-bit types in 4 bits, 5- and 6-bit in 6, Q8_0 in 8 (gguf_experts.h). With --quantize
  // w4a8 only those already 4-bit with its group; otherwise they are requantised.
  std::optional<CodedFormat> gguf_f13, gguf_f2;
  if (opt.gguf_q4_0_as_int4 && !fused_gu && n_local > 0 && qf == QuantFormat::None && !opt.quantize_w8a8 &&
      gguf::is_coded(ck, gate[0]->tensor_read()) && gguf::is_coded(ck, up[0]->tensor_read()) &&
      gguf::is_coded(ck, down[0]->tensor_read())) {
    const TensorRead g0 = gate[0]->tensor_read(), u0 = up[0]->tensor_read(), d0 = down[0]->tensor_read();
    const CodedFormat f13 = gguf::common_format(ck, {&g0, &u0}), f2 = gguf::common_format(ck, {&d0});
    auto fits = [&](const CodedFormat& f) { return f.bits == 4 && f.group == opt.int4_group; };
    if (!opt.quantize_w4a8 || (fits(f13) && fits(f2))) {
      gguf_f13 = f13;
      gguf_f2 = f2;
    }
  }
  const bool gguf_coded = gguf_f13.has_value();
  // GPTQ / AWQ / compressed-tensors int4 experts stay 4-bit the same way (loader/hf_int4).
  // With an act-order g_idx too: each expert's inputs and neurons reordered so its groups
  // are whole (hf_orders, one per expert). A GPTQ desc_act checkpoint gets them for every
  // layer, so every rank holds the same format (EPLB moves experts between ranks' slots);
  // elsewhere only where some local expert needs them. Where some expert has no such order
  // (or this rank's TP slice cuts a group) the layer's experts are dequantised exactly,
  // like any float weight.
  std::vector<std::optional<hf_int4::ExpertOrders>> hf_orders;
  auto hf_int4_ok = [&] {
    bool exact = true;
    for (int64_t e = 0; e < n_local; ++e)
      for (const LayerRead* r : {gate[e], up[e], down[e]}) {
        if (!hf_int4::is_int4_weight(ck, r->key)) return false;
        exact = exact && hf_int4::int4_exact(ck, r->tensor_read());
      }
    if (exact && !parse_quant_config(ck.config()).desc_act) return true;
    hf_orders.resize(static_cast<size_t>(n_local));
    for (int64_t e = 0; e < n_local; ++e) {
      hf_orders[e] = hf_int4::expert_act_order(ck, gate[e]->tensor_read(), up[e]->tensor_read(), down[e]->tensor_read());
      if (!hf_orders[e]) return false;
    }
    return true;
  };
  const bool hf4 = opt.gguf_q4_0_as_int4 && !fused_gu && n_local > 0 && qf == QuantFormat::None &&
                   !opt.quantize_w8a8 && hf_int4::is_int4_weight(ck, gate[0]->key) &&
                   (!opt.quantize_w4a8 || opt.int4_group == hf_int4::kernel_group(ck)) && hf_int4_ok();
  const DType experts_dtype =
      opt.quantize_w8a8 || opt.quantize_w4a8 || gguf_coded || hf4 || qf != QuantFormat::None ? DType::I8 : opt.compute;
  // FP8 block-scaled experts computed in bf16 stay e4m3 in memory: the GEMM dequantises
  // panel by panel (fp8_weights.h); for f32 compute they are dequantised here (load_read).
  const LayerRead* first_gu = fused_gu ? fused_gu : n_local > 0 ? gate[0] : nullptr;
  const LayerRead* first_dn = fused_gu ? fused_dn : n_local > 0 ? down[0] : nullptr;
  const bool fp8 = experts_dtype == DType::BF16 && first_gu && is_fp8_weight(ck, first_gu->key);
  if (fp8) {
    w.w13 = make_packed_fp8(n_local, 2 * Il, H, /*gated=*/true, fp8_slice_block_k(ck, first_gu->tensor_read()));
    w.w2 = make_packed_fp8(n_local, H, Il, /*gated=*/false, fp8_slice_block_k(ck, first_dn->tensor_read()));
  } else if (gguf_coded) {
    w.w13 = make_packed_experts_coded(n_local, 2 * Il, H, /*gated=*/true, *gguf_f13);
    w.w2 = make_packed_experts_coded(n_local, H, Il, /*gated=*/false, *gguf_f2);
  } else if (opt.quantize_w4a8 || hf4) {
    const int64_t group = hf4 ? hf_int4::kernel_group(ck) : opt.int4_group;
    w.w13 = make_packed_experts_int4(n_local, 2 * Il, H, /*gated=*/true, group);
    w.w2 = make_packed_experts_int4(n_local, H, Il, /*gated=*/false, group);
    if (hf4 && !hf_orders.empty()) w.w13.in_perm = Tensor::empty({n_local, H}, DType::I32);
  } else {
    w.w13 = make_packed_experts(n_local, 2 * Il, H, experts_dtype, /*gated=*/true);
    w.w2 = make_packed_experts(n_local, H, Il, experts_dtype, /*gated=*/false);
  }
  std::exception_ptr err;
  std::mutex err_mu;
  auto guarded = [&](auto&& fn) {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!err) err = std::current_exception();
    }
  };
  if (qf != QuantFormat::None) {
    load_quant_experts(ck, cfg, layer, opt, qf, w);
  } else if (fused_gu && fp8) {
    // Stacked FP8 layout: the codes stay e4m3; each expert is packed from its rows.
    const Fp8Slice gu = load_fp8_slice(ck, fused_gu->tensor_read()), dn = load_fp8_slice(ck, fused_dn->tensor_read());
    const uint64_t per_expert = (gu.codes.nbytes() + dn.codes.nbytes()) / std::max<int64_t>(1, n_local);
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = 0; e < n_local; ++e)
      guarded([&] {
        pack_fp8(w.w13, e, gu, e);
        pack_fp8(w.w2, e, dn, e);
        if (opt.progress) opt.progress->advance(per_expert);
      });
    for (const LayerRead* r : {fused_gu, fused_dn}) release_sharded(ck, r->tensor_read());  // packed: held once
  } else if (fused_gu) {
    // Stacked layout: this rank's experts' rows only (and its I slice of each block).
    const Tensor gu = load_read(ck, *fused_gu);  // [E_l, 2 Il, H]
    const Tensor dn = load_read(ck, *fused_dn);  // [E_l, H, Il]
    const uint64_t per_expert = (gu.nbytes() + dn.nbytes()) / std::max<int64_t>(1, n_local);
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = 0; e < n_local; ++e)
      guarded([&] {
        pack_expert(w.w13, e, gu.slice_rows(e, e + 1).reshape({2 * Il, H}));
        pack_expert(w.w2, e, dn.slice_rows(e, e + 1).reshape({H, Il}));
        // This expert's rows of the stacked tensors are packed: their pages leave the process.
        const int64_t g = w.expert_begin + e;
        release_sharded(ck, fused_gu->key, fused_gu->full_shape,
                        ShardRule::expert_local_stacked(g, g + 1, 0, 2), fused_gu->rank, fused_gu->size);
        release_sharded(ck, fused_dn->key, fused_dn->full_shape, ShardRule::expert_local_stacked(g, g + 1, 1),
                        fused_dn->rank, fused_dn->size);
        if (opt.progress) opt.progress->advance(per_expert);
      });
  } else {
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = 0; e < n_local; ++e)
      guarded([&] {
        if (hf4) {
          hf_int4::pack_expert(ck, w.w13, w.w2, e, gate[e]->tensor_read(), up[e]->tensor_read(),
                               down[e]->tensor_read(), hf_orders.empty() ? nullptr : &*hf_orders[e]);
          return;
        }
        if (gguf_coded) {
          // GGUF stores a layer's experts as one tensor per projection, so every expert
          // shares expert 0's types; checked all the same (a hostile index could differ).
          MOE_CHECK(gguf::is_coded(ck, gate[e]->tensor_read()) && gguf::is_coded(ck, up[e]->tensor_read()) &&
                        gguf::is_coded(ck, down[e]->tensor_read()),
                    "layer {}: expert 0's projections are GGUF integer-coded types but '{}', '{}' or '{}' is not",
                    layer, gate[e]->key, up[e]->key, down[e]->key);
          gguf::pack_expert(ck, w.w13, w.w2, e, gate[e]->tensor_read(), up[e]->tensor_read(), down[e]->tensor_read());
          for (const LayerRead* r : {gate[e], up[e], down[e]}) release_sharded(ck, r->tensor_read());
          if (opt.progress)
            opt.progress->advance(read_bytes(ck, gate[e]->tensor_read()) + read_bytes(ck, up[e]->tensor_read()) +
                                  read_bytes(ck, down[e]->tensor_read()));
          return;
        }
        if (fp8) {
          const Fp8Slice g = load_fp8_slice(ck, gate[e]->tensor_read()), u = load_fp8_slice(ck, up[e]->tensor_read()),
                         d = load_fp8_slice(ck, down[e]->tensor_read());
          pack_fp8_gated(w.w13, e, g, u);
          pack_fp8(w.w2, e, d);
          for (const LayerRead* r : {gate[e], up[e], down[e]}) release_sharded(ck, r->tensor_read());
          if (opt.progress)
            opt.progress->advance(read_bytes(ck, gate[e]->tensor_read()) + read_bytes(ck, up[e]->tensor_read()) +
                                  read_bytes(ck, down[e]->tensor_read()));
          return;
        }
        // load_sharded gives zero-copy views of the mapping for gate and up (one row
        // range, also under MoE-TP) and for down (unless MoE-TP slices its columns);
        // they are packed straight from the file's dtype, with no copy of the expert.
        const Tensor g = load_read(ck, *gate[e]), u = load_read(ck, *up[e]), d = load_read(ck, *down[e]);
        pack_expert_gated(w.w13, e, g, u);
        pack_expert(w.w2, e, d);
        // Packed: the expert's file pages leave the process (the page cache keeps them),
        // so the rank holds its weights once, not once packed and once mapped.
        for (const LayerRead* r : {gate[e], up[e], down[e]}) release_sharded(ck, r->tensor_read());
        if (opt.progress) opt.progress->advance(g.nbytes() + u.nbytes() + d.nbytes());
      });
  }
  if (err) std::rethrow_exception(err);

  if (!shared.empty()) {
    const MlpKeys mk = mlp_keys(cfg, layer, &ck);
    w.shared = shared[0]->int8 ? load_int8_gated_mlp(ck, cfg, layer, mk.shared_prefix.substr(fmt::format("model.layers.{}.", layer).size()),
                                                     cfg.shared_intermediate_size)
                               : load_gated(ck, *shared[0], *shared[1], *shared[2], cfg.act, opt.compute,
                                            opt.gguf_q4_0_as_int4);
    if (sgate) w.shared_gate = load_read(ck, *sgate, DType::F32).reshape({H});
  }
  // A fault on one tensor's first page maps the neighbouring cached pages too (the
  // kernel's fault-around, 64 KiB), the released tail of the tensor before it included:
  // once more over the layer's reads, so none of its file pages stays in the process.
  for (const LayerRead& r : reads) release_sharded(ck, r.tensor_read());
  return w;
}

GatedMlpWeights load_dense_mlp(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, const MlpLoadOptions& opt) {
  if (!opt.cache) return load_dense_mlp_packed(ck, cfg, layer, opt);
  uint64_t expert_bytes = 0;
  const std::string key = mlp_cache_key(ck, cfg, layer, opt, &expert_bytes);
  return cached_load<GatedMlpWeights>(
      opt.cache, key, [&] { return load_dense_mlp_packed(ck, cfg, layer, opt); },
      [](const GatedMlpWeights& w) {
        CacheRecord r;
        encode_gated(r, "", w);
        return r;
      },
      [&](const CacheRecord& r) { return decode_gated(r, "", cfg.hidden_size); });
}

GatedMlpWeights load_dense_mlp_packed(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer,
                                      const MlpLoadOptions& opt) {
  MOE_CHECK(layer >= 0 && layer < cfg.n_layers, "layer {} out of range: the model has {} layers", layer,
            cfg.n_layers);
  MOE_CHECK(!cfg.is_moe_layer(layer), "layer {} has a MoE block, not a dense MLP", layer);
  MOE_CHECK(cfg.dense_intermediate_size > 0, "config.json: layer {} is dense but 'intermediate_size' is missing",
            layer);
  MOE_CHECK(opt.compute == DType::F32 || opt.compute == DType::BF16, "compute dtype must be f32 or bf16, got {}",
            dtype_name(opt.compute));
  report_unexpected(ck, cfg, layer, opt);
  const std::vector<LayerRead> reads = mlp_layer_reads(ck, cfg, layer, opt);
  for (const LayerRead& r : reads) check_read_or_throw(ck, r, layer);
  if (reads[0].int8) return load_int8_gated_mlp(ck, cfg, layer, "mlp", cfg.dense_intermediate_size);
  return load_gated(ck, reads[0], reads[1], reads[2], cfg.act, opt.compute, opt.gguf_q4_0_as_int4);
}

GatedMlpWeights load_dense_mlp(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, DType compute) {
  MlpLoadOptions opt;
  opt.compute = compute;
  return load_dense_mlp(ck, cfg, layer, opt);
}

}  // namespace moe
