#include "loader/weights_cache/weight_records.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "loader/fp8_weights.h"

namespace moe {

// A field added to PackedExperts must be added to encode_packed / decode_packed too: this
// size is the one the fields below account for (x86-64).
static_assert(sizeof(PackedExperts) == 1048, "PackedExperts changed: update the weights cache records");

namespace {

// The tensors of a PackedExperts, by name.
struct Field {
  const char* name;
  Tensor PackedExperts::*member;
};
constexpr Field kTensors[] = {
    {"data", &PackedExperts::data},       {"w_scale", &PackedExperts::w_scale}, {"w_comp", &PackedExperts::w_comp},
    {"smooth", &PackedExperts::smooth},   {"act_scale", &PackedExperts::act_scale},
    {"w_zero", &PackedExperts::w_zero},   {"w_offset", &PackedExperts::w_offset},
    {"w_sb_d", &PackedExperts::w_sb_d},   {"w_sb_m", &PackedExperts::w_sb_m},
    {"w_sc", &PackedExperts::w_sc},       {"w_mn", &PackedExperts::w_mn},
    {"in_perm", &PackedExperts::in_perm},
};

// The layout the packers allocate for this format with one expert.
PackedExperts empty_layout(const PackedExperts& p, bool offsets) {
  if (p.dtype == DType::F8E4M3) return make_packed_experts_fp8(1, p.n, p.k, p.gated, p.block_k);
  if (p.int4_group > 0)
    return make_packed_experts_coded(1, p.n, p.k, p.gated,
                                     {p.int4_group, p.code_bits, offsets, p.sb_groups, p.uniform_zero});
  return make_packed_experts(1, p.n, p.k, p.dtype, p.gated);
}

}  // namespace

void encode_packed(CacheRecord& r, const std::string& prefix, const PackedExperts& p) {
  r.put(prefix + "dtype", static_cast<int64_t>(p.dtype));
  r.put(prefix + "n_experts", p.n_experts);
  r.put(prefix + "n", p.n);
  r.put(prefix + "k", p.k);
  r.put(prefix + "gated", p.gated ? 1 : 0);
  r.put(prefix + "expert_stride", p.expert_stride);
  r.put(prefix + "block_k", p.block_k);
  r.put(prefix + "int4_group", p.int4_group);
  r.put(prefix + "code_bits", p.code_bits);
  r.put(prefix + "int4_zero_points", p.int4_zero_points ? 1 : 0);
  r.put(prefix + "sb_groups", p.sb_groups);
  r.put(prefix + "uniform_zero", p.uniform_zero);
  r.put(prefix + "offsets", p.int4_group > 0 && coded_format(p).offsets ? 1 : 0);
  for (const Field& f : kTensors) r.put(prefix + f.name, p.*f.member);
}

PackedExperts decode_packed(const CacheRecord& r, const std::string& prefix) {
  PackedExperts p;
  const int64_t dt = r.get(prefix + "dtype");
  MOE_CHECK(dt == static_cast<int64_t>(DType::F32) || dt == static_cast<int64_t>(DType::BF16) ||
                dt == static_cast<int64_t>(DType::I8) || dt == static_cast<int64_t>(DType::F8E4M3),
            "{}dtype: {} is not a packed weight dtype", prefix, dt);
  p.dtype = static_cast<DType>(dt);
  p.n_experts = r.get(prefix + "n_experts");
  p.n = r.get(prefix + "n");
  p.k = r.get(prefix + "k");
  p.gated = r.get(prefix + "gated") != 0;
  p.expert_stride = r.get(prefix + "expert_stride");
  p.block_k = r.get(prefix + "block_k");
  p.int4_group = r.get(prefix + "int4_group");
  p.code_bits = static_cast<int>(r.get(prefix + "code_bits"));
  p.int4_zero_points = r.get(prefix + "int4_zero_points") != 0;
  p.sb_groups = r.get(prefix + "sb_groups");
  const int64_t uz = r.get(prefix + "uniform_zero");
  MOE_CHECK(uz >= -1 && uz < 256 && (uz < 0 || p.int4_group > 0), "{}uniform_zero: {}", prefix, uz);
  p.uniform_zero = static_cast<int>(uz);
  MOE_CHECK(p.n_experts >= 0 && p.n_experts <= (int64_t{1} << 20), "{}n_experts: {}", prefix, p.n_experts);
  MOE_CHECK(p.int4_group == 0 || p.dtype == DType::I8, "{}: group codes in a {} weight", prefix, dtype_name(p.dtype));
  // The empty layout of the same format (its own checks refuse bad sizes and formats):
  // the record's tensors must be exactly it, times n_experts.
  const PackedExperts want = empty_layout(p, r.get(prefix + "offsets") != 0);
  MOE_CHECK(p.expert_stride == want.expert_stride, "{}expert_stride: {}, the format packs {}", prefix,
            p.expert_stride, want.expert_stride);
  for (const Field& f : kTensors) {
    const Tensor t = r.tensor(prefix + f.name);
    const Tensor& w = want.*f.member;
    Shape shape = w.shape();
    DType dtype = w.dtype();
    if (std::string(f.name) == "data") {
      shape = {p.n_experts * p.expert_stride};
    } else if (std::string(f.name) == "smooth" || std::string(f.name) == "act_scale") {
      // W8A8's optional SmoothQuant vectors and static activation scales.
      MOE_CHECK(!t.defined() || (p.dtype == DType::I8 && p.int4_group == 0), "{}{}: only W8A8 weights have it",
                prefix, f.name);
      if (!t.defined()) continue;
      shape = std::string(f.name) == "smooth" ? Shape{p.n_experts, p.k} : Shape{p.n_experts};
      dtype = DType::F32;
    } else if (std::string(f.name) == "in_perm") {
      // Act-order group-coded experts: each row a permutation of the k inputs (checked
      // below: the kernels index activation rows with it).
      MOE_CHECK(!t.defined() || p.int4_group > 0, "{}in_perm: only group-coded weights have it", prefix);
      if (!t.defined()) continue;
      shape = {p.n_experts, p.k};
      dtype = DType::I32;
      if (t.dtype() == dtype && t.shape() == shape) {
        std::vector<uint8_t> seen(static_cast<size_t>(p.k));
        for (int64_t e = 0; e < p.n_experts; ++e) {
          std::fill(seen.begin(), seen.end(), 0);
          for (int64_t j = 0; j < p.k; ++j) {
            const int32_t v = t.data<int32_t>()[e * p.k + j];
            MOE_CHECK(v >= 0 && v < p.k && !seen[v], "{}in_perm: expert {} is not a permutation of {} inputs (entry {}: {})",
                      prefix, e, p.k, j, v);
            seen[v] = 1;
          }
        }
      }
    } else {
      MOE_CHECK(t.defined() == (w.defined() || std::string(f.name) == "data"), "{}{}: {} where the format has {}",
                prefix, f.name, t.defined() ? "a tensor" : "none", t.defined() ? "none" : "one");
      if (!t.defined()) continue;
      if (w.defined()) shape[0] = p.n_experts;
    }
    MOE_CHECK(t.dtype() == dtype && t.shape() == shape, "{}{}: {}, the format packs {}[{}]", prefix, f.name,
              t.describe(), dtype_name(dtype), shape_str(shape));
    p.*f.member = t;
  }
  return p;
}

void encode_gated(CacheRecord& r, const std::string& prefix, const GatedMlpWeights& w) {
  encode_packed(r, prefix + "w13.", w.w13);
  encode_packed(r, prefix + "w2.", w.w2);
  r.put(prefix + "act", static_cast<int64_t>(w.act));
}

GatedMlpWeights decode_gated(const CacheRecord& r, const std::string& prefix, int64_t hidden) {
  GatedMlpWeights w;
  w.w13 = decode_packed(r, prefix + "w13.");
  w.w2 = decode_packed(r, prefix + "w2.");
  const int64_t act = r.get(prefix + "act");
  MOE_CHECK(act >= 0 && act <= static_cast<int64_t>(Activation::GeluErfMul), "{}act: {}", prefix, act);
  w.act = static_cast<Activation>(act);
  MOE_CHECK(w.w13.n_experts == 1 && w.w2.n_experts == 1 && w.w13.gated && w.w13.k == hidden && w.w2.n == hidden &&
                w.w13.n == 2 * w.w2.k,
            "{}: an MLP of 1 x [{}, {}] and 1 x [{}, {}] for hidden size {}", prefix, w.w13.n, w.w13.k, w.w2.n,
            w.w2.k, hidden);
  return w;
}

CacheRecord encode_moe_layer(const MoeLayerWeights& w) {
  CacheRecord r;
  encode_packed(r, "gate.", w.gate);
  r.put("correction_bias", w.correction_bias);
  r.put("expert_begin", w.expert_begin);
  r.put("expert_end", w.expert_end);
  r.put("has_slot_expert", w.slot_expert.empty() ? 0 : 1);
  if (!w.slot_expert.empty()) {
    Tensor s = Tensor::empty({static_cast<int64_t>(w.slot_expert.size())}, DType::I32);
    std::copy(w.slot_expert.begin(), w.slot_expert.end(), s.data<int32_t>());
    r.put("slot_expert", s);
  }
  encode_packed(r, "w13.", w.w13);
  encode_packed(r, "w2.", w.w2);
  r.put("smooth_all", w.smooth_all);
  r.put("act_scale_all", w.act_scale_all);
  r.put("has_shared", w.shared ? 1 : 0);
  if (w.shared) encode_gated(r, "shared.", *w.shared);
  r.put("shared_gate", w.shared_gate);
  return r;
}

MoeLayerWeights decode_moe_layer(const CacheRecord& r, const MoeConfig& cfg, int64_t expert_begin,
                                 int64_t expert_end) {
  const int64_t E = cfg.n_experts, H = cfg.hidden_size;
  MoeLayerWeights w;
  w.gate = decode_packed(r, "gate.");
  MOE_CHECK(w.gate.n_experts == 1 && w.gate.n == E && w.gate.k == H && w.gate.dtype == DType::F32,
            "gate: a router of 1 x [{}, {}] {}, the model has [{}, {}] f32", w.gate.n, w.gate.k,
            dtype_name(w.gate.dtype), E, H);
  w.correction_bias = r.tensor("correction_bias");
  w.expert_begin = r.get("expert_begin");
  w.expert_end = r.get("expert_end");
  MOE_CHECK(w.expert_begin == expert_begin && w.expert_end == expert_end, "experts [{}, {}), this rank loads [{}, {})",
            w.expert_begin, w.expert_end, expert_begin, expert_end);
  if (r.get("has_slot_expert") != 0) {
    const Tensor s = r.tensor("slot_expert");
    MOE_CHECK(s.defined() && s.dtype() == DType::I32 && s.ndim() == 1, "slot_expert: missing or not i32 [P]");
    w.slot_expert.assign(s.data<int32_t>(), s.data<int32_t>() + s.numel());
  }
  w.w13 = decode_packed(r, "w13.");
  w.w2 = decode_packed(r, "w2.");
  MOE_CHECK(w.w13.n_experts == w.n_local() && w.w2.n_experts == w.n_local() && w.w13.gated && w.w13.k == H &&
                w.w2.n == H && w.w13.n == 2 * w.w2.k,
            "experts: {} x [{}, {}] and {} x [{}, {}] for {} experts of hidden size {}", w.w13.n_experts, w.w13.n,
            w.w13.k, w.w2.n_experts, w.w2.n, w.w2.k, w.n_local(), H);
  w.smooth_all = r.tensor("smooth_all");
  w.act_scale_all = r.tensor("act_scale_all");
  if (r.get("has_shared") != 0) w.shared = decode_gated(r, "shared.", H);
  w.shared_gate = r.tensor("shared_gate");
  // The rest (correction bias, smooth vectors, shared gate sizes, slot ids) MoeLayer checks
  // when it takes the weights, as it does for weights read from the checkpoint.
  return w;
}

}  // namespace moe
