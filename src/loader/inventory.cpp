#include "loader/inventory.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "core/check.h"
#include "loader/gguf/gguf_experts.h"
#include "loader/hf_int4/hf_int4.h"
#include "loader/scales.h"

namespace moe {

const char* tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::Attention: return "attention";
    case TensorKind::DenseMlp: return "dense MLP";
    case TensorKind::Experts: return "experts";
    case TensorKind::SharedExperts: return "shared experts";
    case TensorKind::Router: return "router";
    case TensorKind::Norm: return "norms";
    case TensorKind::Embedding: return "embeddings";
    case TensorKind::LmHead: return "lm_head";
    case TensorKind::Other: return "other";
  }
  return "?";
}

TensorKind classify_tensor(const std::string& key) {
  auto has = [&](const char* s) { return key.find(s) != std::string::npos; };
  if (has("embed_tokens")) return TensorKind::Embedding;
  if (key.starts_with("lm_head")) return TensorKind::LmHead;
  if (has("shared_expert")) return TensorKind::SharedExperts;  // shared_expert(s), shared_expert_gate
  if (has(".experts.")) return TensorKind::Experts;
  if (has("e_score_correction_bias") || key.ends_with(".mlp.gate.weight") ||
      key.ends_with(".block_sparse_moe.gate.weight"))
    return TensorKind::Router;
  if (has("norm.") || has("layernorm") || key.ends_with("norm")) return TensorKind::Norm;
  if (has(".self_attn.") || has(".attention.")) return TensorKind::Attention;
  if (has(".mlp.")) return TensorKind::DenseMlp;
  return TensorKind::Other;
}

uint64_t Inventory::non_expert_bytes() const {
  auto it = kinds.find(TensorKind::Experts);
  return tensor_bytes - (it == kinds.end() ? 0 : it->second.bytes);
}

Inventory take_inventory(const Checkpoint& ck) {
  Inventory inv;
  inv.n_files = ck.open_all_shards();
  inv.file_bytes = ck.total_file_bytes();
  inv.header_bytes = ck.header_bytes_opened();
  for (const std::string& key : ck.keys()) {
    const TensorInfo& ti = ck.info(key);
    KindTotals& k = inv.kinds[classify_tensor(key)];
    ++k.count;
    k.bytes += ti.nbytes;
    ++inv.n_tensors;
    inv.tensor_bytes += ti.nbytes;
  }
  return inv;
}

namespace {

bool is_expert(LayerRead::Role r) {
  return r == LayerRead::ExpertGate || r == LayerRead::ExpertUp || r == LayerRead::ExpertDown ||
         r == LayerRead::FusedGateUp || r == LayerRead::FusedDown;
}

// The N of "model.layers.N.<rest>", or -1 for a key outside the decoder layers.
int64_t layer_of_key(const std::string& k) {
  static const std::string head = "model.layers.";
  if (!k.starts_with(head)) return -1;
  int64_t l = 0;
  size_t i = head.size(), digits = 0;
  while (i < k.size() && k[i] >= '0' && k[i] <= '9' && digits < 12) {
    l = l * 10 + (k[i++] - '0');
    ++digits;
  }
  return digits > 0 && i < k.size() && k[i] == '.' ? l : -1;
}

}  // namespace

std::vector<RankPlan> read_plan(const Checkpoint& ck, const MoeConfig& cfg, const Inventory& inv, int ep, int tp,
                                DType compute, const NonMlpReads& non_mlp, int attn_tp) {
  MOE_CHECK(ep >= 1 && tp >= 1, "--ep and --tp must be positive (got --ep {} --tp {})", ep, tp);
  MOE_CHECK(attn_tp == 1 || (tp == 1 && ep == attn_tp),
            "--attn-tp {} splits attention over the EP group: it needs --ep {} and --tp 1 (got --ep {} --tp {})",
            attn_tp, attn_tp, ep, tp);
  MOE_CHECK(ep <= cfg.n_experts, "--ep {} exceeds the {} routed experts", ep, cfg.n_experts);
  MOE_CHECK(cfg.moe_intermediate_size % tp == 0, "--tp {} does not divide the experts' moe_intermediate_size {}", tp,
            cfg.moe_intermediate_size);
  // What a rank reads outside the MLP blocks depends on its rank in the attention group
  // only: its TP rank, or under --attn-tp the rank itself.
  const int groups = std::max(tp, attn_tp);
  std::vector<uint64_t> non_mlp_bytes(groups);
  for (int t = 0; t < groups; ++t)
    for (const TensorRead& r : non_mlp(t, groups)) non_mlp_bytes[t] += read_bytes(ck, r);
  std::vector<RankPlan> plans;
  for (int r = 0; r < ep * tp; ++r) {
    RankPlan p;
    p.rank = r;
    p.ep_rank = r / tp;
    p.tp_rank = r % tp;
    // Placement::contiguous's blocks, by arithmetic (no per-expert table).
    p.expert_begin = p.ep_rank * cfg.n_experts / ep;
    p.expert_end = (p.ep_rank + 1) * cfg.n_experts / ep;
    const int attn_rank = attn_tp > 1 ? r : p.tp_rank;
    p.non_expert_bytes = non_mlp_bytes[attn_rank];
    p.header_bytes = inv.header_bytes;
    MlpLoadOptions opt;
    opt.expert_begin = p.expert_begin;
    opt.expert_end = p.expert_end;
    opt.tp_rank = p.tp_rank;
    opt.tp_size = tp;
    opt.mlp_tp_rank = attn_tp > 1 ? attn_rank : 0;
    opt.mlp_tp_size = attn_tp;
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      bool fp8 = false;  // FP8 experts computed in bf16 stay e4m3: 1 byte per weight
      int64_t int4_group = 0;  // int4 experts (GPTQ / AWQ / compressed-tensors) stay int4
      std::vector<TensorRead> gu, dn;  // GGUF integer-coded experts stay as stored
      for (const LayerRead& rd : mlp_layer_reads(ck, cfg, l, opt)) {
        (is_expert(rd.role) ? p.expert_bytes : p.non_expert_bytes) += read_bytes(ck, rd.tensor_read());
        if (!is_expert(rd.role)) continue;
        fp8 |= ck.has(rd.key) && ck.info(rd.key).dtype == DType::F8E4M3;
        if (hf_int4::is_int4_weight(ck, rd.key)) int4_group = hf_int4::kernel_group(ck);
        else if (gguf::is_coded(ck, rd.tensor_read())) (rd.role == LayerRead::ExpertDown ? dn : gu).push_back(rd.tensor_read());
      }
      if (cfg.is_moe_layer(l)) {
        const uint64_t experts = static_cast<uint64_t>(p.expert_end - p.expert_begin);
        const uint64_t I = static_cast<uint64_t>(cfg.moe_intermediate_size / tp), H = cfg.hidden_size;
        const uint64_t weights = experts * 3 * I * H;
        if (!gu.empty() && !dn.empty()) {
          // gate + up in one format, down in its own (gguf_experts.h; panel padding aside).
          auto ptrs = [](const std::vector<TensorRead>& v) {
            std::vector<const TensorRead*> out;
            for (const TensorRead& r : v) out.push_back(&r);
            return out;
          };
          p.resident_expert_bytes += experts * (gguf::coded_bytes(gguf::common_format(ck, ptrs(gu)), 2 * I, H) +
                                                gguf::coded_bytes(gguf::common_format(ck, ptrs(dn)), H, I));
        } else {
          // int4: half a byte per weight plus an f32 scale and a u8 zero point per group
          // (kernels/grouped_gemm_int4.h; its panel padding aside).
          p.resident_expert_bytes += int4_group > 0 ? weights / 2 + weights / int4_group * 5
                                                    : weights * (fp8 && compute == DType::BF16 ? 1 : dtype_size(compute));
        }
      }
    }
    plans.push_back(p);
  }
  return plans;
}

std::vector<TensorProblem> check_checkpoint(const Checkpoint& ck, const MoeConfig& cfg,
                                            const std::vector<TensorRead>& non_mlp) {
  std::vector<TensorProblem> out;
  const auto keys = ck.keys();
  // Every layer needs at least one tensor: a config claiming more layers than the
  // checkpoint has tensors is wrong (and would make us enumerate forever).
  if (static_cast<uint64_t>(cfg.n_layers) > keys.size()) {
    out.push_back({TensorProblem::Missing, "model.layers",
                   fmt::format("config.json: num_hidden_layers={} but {} holds only {} tensors", cfg.n_layers, ck.dir(),
                               keys.size())});
    return out;
  }
  // Outside the MLP blocks too a tensor may be block-scaled FP8 (attention, lm_head):
  // loader/fp8_weights.h checks its scales.
  for (const TensorRead& r : non_mlp)
    if (auto p = tensor_problem(ck, r.key, r.shape, r.layer)) {
      // An int8 weight of FastDeploy's W8A8 attention: i8 is what it must be.
      if (r.int8 && p->kind == TensorProblem::WrongDType && ck.info(r.key).dtype == DType::I8) continue;
      out.push_back(std::move(*p));
    }
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    for (auto& p : check_mlp_block(ck, cfg, l, 64)) out.push_back(std::move(p));
    for (auto& k : unexpected_mlp_tensors(ck, cfg, l))
      out.push_back({TensorProblem::Unexpected, k,
                     fmt::format("layer {}: unexpected tensor '{}' in {} (not used by the {} name map)", l, k,
                                 ck.file_of(k), cfg.model_type)});
  }
  // Every other key must be one of the model's reads: the MLP blocks' keys were
  // judged above by their own name map.
  std::unordered_set<std::string> read;
  for (const TensorRead& r : non_mlp) {
    read.insert(r.key);
    if (ck.has(r.key) && ck.info(r.key).dtype == DType::F8E4M3) read.insert(r.key + "_scale_inv");
  }
  for (const std::string& k : keys) {
    if (read.count(k)) continue;
    // The int4 tensors of a GPTQ / AWQ / compressed-tensors weight the model reads.
    if (hf_int4::is_int4_key(k) && read.count(hf_int4::weight_key_of(k))) continue;
    const int64_t l = layer_of_key(k);
    if (l >= cfg.n_layers && l < cfg.n_layers + cfg.n_mtp_layers) continue;  // MTP: known, skipped (mtp_layer_keys)
    if (l >= cfg.n_layers) {
      out.push_back({TensorProblem::Unexpected, k,
                     fmt::format("unexpected tensor '{}' in {}: layer {} but num_hidden_layers={}", k, ck.file_of(k),
                                 l, cfg.n_layers)});
      continue;
    }
    if (l >= 0) {
      // Activation scales of the layer (attention's included), read by load_layer_scales.
      if (auto m = match_scale_key(cfg.family, k); m && m->layer == l && m->entry->kind == ScaleKind::Activation)
        continue;
      const auto blocks = mlp_block_prefixes(l);
      if (std::any_of(blocks.begin(), blocks.end(), [&](const std::string& b) { return k.starts_with(b); })) continue;
    }
    out.push_back({TensorProblem::Unexpected, k,
                   fmt::format("{}unexpected tensor '{}' in {} (the {} model does not read it)",
                               l >= 0 ? fmt::format("layer {}: ", l) : "", k, ck.file_of(k), cfg.model_type)});
  }
  return out;
}

std::vector<std::string> mtp_layer_keys(const Checkpoint& ck, const MoeConfig& cfg) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < cfg.n_mtp_layers; ++i)
    for (std::string& k : ck.keys_with_prefix(fmt::format("model.layers.{}.", cfg.n_layers + i))) out.push_back(std::move(k));
  return out;
}

std::vector<std::string> beyond_layer_keys(const Checkpoint& ck, const MoeConfig& cfg) {
  std::vector<std::string> out;
  for (const std::string& k : ck.keys())
    if (layer_of_key(k) >= cfg.n_layers + cfg.n_mtp_layers) out.push_back(k);
  return out;
}

void load_share(const Checkpoint& ck, const MoeConfig& cfg, const std::vector<TensorRead>& non_mlp,
                const MlpLoadOptions& opt, bool pack) {
  // An owned copy in the file's dtype: the bytes really come into process memory.
  auto copy = [&](const TensorRead& r) {
    const Tensor t = load_sharded(ck, r, ck.info(r.key).dtype);
    if (opt.progress) opt.progress->advance(t.nbytes());
    const std::string skey = r.key + "_scale_inv";
    if (ck.info(r.key).dtype == DType::F8E4M3 && ck.has(skey)) {  // an FP8 weight's read includes its scales
      const Tensor s = load_sharded(ck, fp8_scale_read(r, ck.info(skey).shape), ck.info(skey).dtype);
      if (opt.progress) opt.progress->advance(s.nbytes());
    }
  };
  for (const TensorRead& r : non_mlp) prefetch_sharded(ck, r);
  for (const TensorRead& r : non_mlp) copy(r);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::vector<LayerRead> reads = mlp_layer_reads(ck, cfg, l, opt);
    if (!pack) {
      for (const LayerRead& r : reads) prefetch_sharded(ck, r.tensor_read());
      for (const LayerRead& r : reads) copy(r.tensor_read());
      continue;
    }
    if (cfg.is_moe_layer(l))
      load_moe_layer(ck, cfg, l, opt);  // advances the progress by the experts itself
    else
      load_dense_mlp(ck, cfg, l, opt);
    if (opt.progress)
      for (const LayerRead& r : reads)
        if (!is_expert(r.role)) opt.progress->advance(read_bytes(ck, r.tensor_read()));
  }
}

}  // namespace moe
