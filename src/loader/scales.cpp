#include "loader/scales.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace moe {

namespace {

ScaleMapEntry entry(std::string ck, std::string fd, std::string eng, ScaleKind k, ScaleScope s) {
  return {std::move(ck), std::move(fd), std::move(eng), k, s};
}

// FastDeploy / ERNIE-4.5: activation_scale -> in_scale -> act_scale, fused up_gate_proj.
std::vector<ScaleMapEntry> ernie_table() {
  using K = ScaleKind;
  using S = ScaleScope;
  std::vector<ScaleMapEntry> t;
  for (const char* m : {"qkv_proj", "o_proj"}) {
    const std::string p = std::string("self_attn.") + m;
    t.push_back(entry(p + ".activation_scale", p + ".in_scale", p + ".act_scale", K::Activation, S::Layer));
    t.push_back(entry(p + ".weight_scale", p + ".weight_scale", p + ".weight_scale", K::Weight, S::Layer));
  }
  const std::pair<const char*, const char*> attn[] = {{"cachek_matmul", "cache_k_scale"},
                                                      {"cachev_matmul", "cache_v_scale"},
                                                      {"q_matmul", "q_scale"},
                                                      {"s_matmul", "s_scale"}};
  for (const auto& [m, eng] : attn) {
    const std::string p = std::string("self_attn.") + m;
    t.push_back(entry(p + ".activation_scale", p + ".in_scale", std::string("self_attn.attn.") + eng, K::Activation,
                      S::Layer));
  }
  for (const char* blk : {"mlp", "mlp.shared_experts"})
    for (const char* m : {"up_gate_proj", "down_proj"}) {
      const std::string p = std::string(blk) + "." + m;
      t.push_back(entry(p + ".activation_scale", p + ".in_scale", p + ".act_scale", K::Activation, S::Layer));
      t.push_back(entry(p + ".weight_scale", p + ".weight_scale", p + ".weight_scale", K::Weight, S::Layer));
    }
  t.push_back(entry("mlp.experts.up_gate_proj.activation_scale", "mlp.experts.up_gate_proj.in_scale",
                    "mlp.experts.up_gate_proj_in_scale", K::Activation, S::SharedByExperts));
  // Some exports repeat the shared scale under every expert: same engine parameter.
  t.push_back(entry("mlp.experts.{e}.up_gate_proj.activation_scale", "mlp.experts.{e}.up_gate_proj.in_scale",
                    "mlp.experts.up_gate_proj_in_scale", K::Activation, S::SharedByExperts));
  t.push_back(entry("mlp.experts.{e}.down_proj.activation_scale", "mlp.experts.{e}.down_proj.in_scale",
                    "mlp.experts.down_proj_in_scale", K::Activation, S::PerExpert));
  for (const char* m : {"up_gate_proj", "down_proj"})
    t.push_back(entry(fmt::format("mlp.experts.{{e}}.{}.weight_scale", m),
                      fmt::format("mlp.experts.{{e}}.{}.weight_scale", m),
                      fmt::format("mlp.experts.{}_weight_scale", m), K::Weight, S::PerExpert));
  return t;
}

// Hugging Face FP8 conventions (input_scale / weight_scale / weight_scale_inv) on
// every linear module of the family.
std::vector<ScaleMapEntry> hf_table(Family f) {
  using K = ScaleKind;
  using S = ScaleScope;
  std::vector<std::string> attn, mlp = {"gate_proj", "up_proj", "down_proj"}, experts, shared_blocks;
  std::string expert_block = "mlp.experts";
  switch (f) {
    case Family::DeepseekV2:
    case Family::DeepseekV3:
      attn = {"q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
      shared_blocks = {"mlp.shared_experts"};
      experts = mlp;
      break;
    case Family::Mixtral:
      attn = {"q_proj", "k_proj", "v_proj", "o_proj"};
      expert_block = "block_sparse_moe.experts";
      experts = {"w1", "w3", "w2"};
      break;
    default:
      attn = {"q_proj", "k_proj", "v_proj", "o_proj"};
      if (f == Family::Qwen2Moe) shared_blocks = {"mlp.shared_expert"};
      experts = mlp;
      break;
  }
  const std::pair<const char*, const char*> kinds[] = {
      {"input_scale", "act_scale"}, {"weight_scale", "weight_scale"}, {"weight_scale_inv", "weight_scale_inv"}};
  std::vector<ScaleMapEntry> t;
  auto layer_module = [&](const std::string& p) {
    for (const auto& [ck, eng] : kinds)
      t.push_back(entry(p + "." + ck, p + "." + ck, p + "." + eng,
                        std::string(ck) == "input_scale" ? K::Activation : K::Weight, S::Layer));
  };
  for (const auto& m : attn) layer_module("self_attn." + m);
  for (const auto& m : mlp) layer_module("mlp." + m);
  for (const auto& b : shared_blocks)
    for (const auto& m : mlp) layer_module(b + "." + m);
  for (const auto& m : experts)
    for (const auto& [ck, eng] : kinds)
      t.push_back(entry(expert_block + ".{e}." + m + "." + ck, expert_block + ".{e}." + m + "." + ck,
                        "mlp.experts." + m + "_" + eng, std::string(ck) == "input_scale" ? K::Activation : K::Weight,
                        S::PerExpert));
  return t;
}

// Matches `rel` against a pattern with at most one "{e}"; sets *expert.
bool match_pattern(const std::string& pat, const std::string& rel, int64_t* expert) {
  const size_t ph = pat.find("{e}");
  if (ph == std::string::npos) return pat == rel;
  const std::string head = pat.substr(0, ph), tail = pat.substr(ph + 3);
  if (rel.size() <= head.size() + tail.size() || !rel.starts_with(head) || !rel.ends_with(tail)) return false;
  const std::string num = rel.substr(head.size(), rel.size() - head.size() - tail.size());
  if (num.empty() || num.size() > 9 || (num.size() > 1 && num[0] == '0')) return false;
  int64_t v = 0;
  for (char c : num) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *expert = v;
  return true;
}

std::string fill(const std::string& pat, int64_t e) {
  std::string s = pat;
  const size_t ph = s.find("{e}");
  if (ph != std::string::npos) s.replace(ph, 3, std::to_string(e));
  return s;
}

}  // namespace

const std::vector<ScaleMapEntry>& scale_map(Family f) {
  static std::once_flag once;
  static std::map<Family, std::vector<ScaleMapEntry>> tables;
  std::call_once(once, [] {
    for (Family g : {Family::Qwen3Moe, Family::Qwen2Moe, Family::Mixtral, Family::DeepseekV2, Family::DeepseekV3})
      tables[g] = hf_table(g);
    // ERNIE: FastDeploy's names, plus the Hugging Face ones (transformers' ERNIE).
    auto t = ernie_table();
    for (auto& e : hf_table(Family::Ernie45Moe)) t.push_back(std::move(e));
    tables[Family::Ernie45Moe] = std::move(t);
  });
  return tables.at(f);
}

std::optional<ScaleMatch> match_scale_key(Family f, const std::string& key) {
  static const std::string kLayers = "model.layers.";
  if (!key.starts_with(kLayers)) return std::nullopt;
  size_t i = kLayers.size();
  int64_t layer = 0;
  size_t digits = 0;
  while (i < key.size() && key[i] >= '0' && key[i] <= '9' && digits < 9) {
    layer = layer * 10 + (key[i++] - '0');
    ++digits;
  }
  if (digits == 0 || i >= key.size() || key[i] != '.') return std::nullopt;
  const std::string rel = key.substr(i + 1);
  for (const ScaleMapEntry& e : scale_map(f)) {
    int64_t expert = -1;
    if (!match_pattern(e.checkpoint, rel, &expert)) continue;
    ScaleMatch m;
    m.entry = &e;
    m.layer = layer;
    m.expert = expert;
    m.fd_key = kLayers + std::to_string(layer) + "." + fill(e.fd_name, expert);
    m.engine = e.engine;
    return m;
  }
  return std::nullopt;
}

int64_t ScaleTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : valid_shape) n *= d;
  return n;
}

float ScaleTensor::at(int64_t i) const {
  const int64_t n = valid_shape.empty() ? 1 : valid_shape.back(), np = data.dim(-1);
  return data.data<float>()[i / n * np + i % n];
}

const ScaleTensor* LayerScales::find(const std::string& engine) const {
  auto it = tensors.find(engine);
  return it == tensors.end() ? nullptr : &it->second;
}

ScaleTensor pad_scale(const Tensor& v_in) {
  Tensor v = v_in.ndim() == 0 ? v_in.reshape({1}) : v_in;
  const Tensor f = v.to(DType::F32);
  const int64_t n = f.dim(-1), rows = n ? f.numel() / n : 0;
  constexpr int64_t kPad = kScaleAlignBytes / sizeof(float);
  const int64_t np = (n + kPad - 1) / kPad * kPad;
  Shape shape = f.shape();
  shape.back() = np;
  ScaleTensor out;
  out.valid_shape = f.shape();
  out.data = Tensor::zeros(shape, DType::F32);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data.data<float>() + r * np, f.data<float>() + r * n, n * sizeof(float));
  return out;
}

namespace {

// Every value of a scale read from `key` must be finite and > 0 (an activation step of 0
// maps every input to one code); a weight channel's abs-max may be 0 (an all-zero row).
void check_scale(const Checkpoint& ck, int64_t layer, const std::string& key, const Tensor& f32, ScaleKind kind) {
  const float* v = f32.data<float>();
  const bool act = kind == ScaleKind::Activation;
  for (int64_t i = 0; i < f32.numel(); ++i)
    MOE_CHECK(std::isfinite(v[i]) && (act ? v[i] > 0.0f : v[i] >= 0.0f),
              "layer {}: scale '{}' in {} holds {} at index {} (must be finite and {})", layer, key, ck.file_of(key),
              v[i], i, act ? "> 0" : ">= 0");
}

}  // namespace

LayerScales load_layer_scales(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer, int64_t expert_begin,
                              int64_t expert_end) {
  ScaleLoad w;
  w.layer = layer;
  w.expert_begin = expert_begin;
  w.expert_end = expert_end;
  return load_layer_scales(ck, cfg, w);
}

LayerScales load_layer_scales(const Checkpoint& ck, const MoeConfig& cfg, const ScaleLoad& what) {
  const int64_t layer = what.layer;
  int64_t expert_begin = what.expert_begin, expert_end = what.expert_end;
  const int64_t E = cfg.n_experts;
  if (expert_end < 0) expert_end = E;
  MOE_CHECK(0 <= expert_begin && expert_begin <= expert_end && expert_end <= E, "expert range [{}, {}) outside [0, {})",
            expert_begin, expert_end, E);
  const std::string prefix = fmt::format("model.layers.{}.", layer);
  // A scale as f32, checked finite and > 0.
  auto read = [&](const std::string& key) {
    Tensor v = ck.view(key).to(DType::F32);
    const auto m = match_scale_key(cfg.family, key);
    check_scale(ck, layer, key, v, m ? m->entry->kind : ScaleKind::Activation);
    return v;
  };
  auto check_dtype = [&](const std::string& key) {
    const TensorInfo& ti = ck.info(key);
    MOE_CHECK(ti.dtype == DType::F32 || ti.dtype == DType::BF16 || ti.dtype == DType::F16,
              "layer {}: scale '{}' in {} has dtype {}, expected f32, bf16 or f16", layer, key, ck.file_of(key),
              dtype_name(ti.dtype));
    return ti;
  };
  LayerScales out;
  // Per-expert scales: engine name -> (entry, found expert ids)
  std::map<std::string, const ScaleMapEntry*> per_expert;
  std::map<std::string, std::vector<std::string>> shared_keys;
  for (const std::string& key : ck.keys_with_prefix(prefix)) {
    const auto m = match_scale_key(cfg.family, key);
    if (!m || m->layer != layer) continue;
    if (what.activations_only && m->entry->kind != ScaleKind::Activation) continue;
    switch (m->entry->scope) {
      case ScaleScope::Layer: {
        check_dtype(key);
        MOE_CHECK(!out.tensors.count(m->engine), "layer {}: two checkpoint tensors map to scale '{}' (one is '{}')",
                  layer, m->engine, key);
        out.tensors[m->engine] = pad_scale(read(key));
        out.tensors[m->engine].key = key;
        break;
      }
      case ScaleScope::SharedByExperts:
        if (m->expert < 0 || (m->expert >= expert_begin && m->expert < expert_end)) shared_keys[m->engine].push_back(key);
        break;
      case ScaleScope::PerExpert:
        MOE_CHECK(m->expert < E, "layer {}: scale '{}' names expert {}, but the model has {} experts", layer, key,
                  m->expert, E);
        per_expert.emplace(m->engine, m->entry);
        break;
    }
  }
  for (const auto& [engine, keys] : shared_keys) {
    // One value for every expert: read the first copy; any others must be equal.
    const TensorInfo first = check_dtype(keys[0]);
    const Tensor v0 = read(keys[0]);
    for (size_t i = 1; i < keys.size(); ++i) {
      check_dtype(keys[i]);
      const Tensor vi = read(keys[i]);
      MOE_CHECK(vi.numel() == v0.numel() && std::memcmp(vi.raw(), v0.raw(), v0.nbytes()) == 0,
                "layer {}: '{}' differs from '{}': the experts' up_gate_proj activation scale must be one value "
                "shared by all experts",
                layer, keys[i], keys[0]);
    }
    (void)first;
    out.tensors[engine] = pad_scale(v0);
    out.tensors[engine].key = keys[0];
  }
  for (const auto& [engine, e] : per_expert) {
    const int64_t n_local = expert_end - expert_begin;
    Tensor stacked;
    Shape one;
    for (int64_t g = expert_begin; g < expert_end; ++g) {
      const std::string key = prefix + fill(e->checkpoint, g);
      MOE_CHECK(ck.has(key), "layer {}: scale '{}' missing from checkpoint {} (the layer has per-expert '{}' scales)",
                layer, key, ck.dir(), engine);
      const TensorInfo& ti = check_dtype(key);
      Shape s = ti.shape.empty() ? Shape{1} : ti.shape;
      if (g == expert_begin) {
        one = s;
        Shape st = s;
        st.insert(st.begin(), n_local);
        stacked = Tensor::empty(st, DType::F32);
      }
      MOE_CHECK(s == one, "layer {}: scale '{}' in {} has shape {}, expected {} like expert {}", layer, key,
                ck.file_of(key), shape_str(s), shape_str(one), expert_begin);
      const Tensor v = read(key);
      std::memcpy(stacked.data<float>() + (g - expert_begin) * v.numel(), v.raw(), v.nbytes());
    }
    if (!stacked.defined()) continue;  // no local experts
    // Scalars per expert become one vector [E_l]: the kernel indexes it by local id.
    if (one == Shape{1}) stacked = stacked.reshape({n_local});
    out.tensors[engine] = pad_scale(stacked);
    out.tensors[engine].key = prefix + fill(e->checkpoint, expert_begin);
  }
  return out;
}

}  // namespace moe
