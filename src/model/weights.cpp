#include "model/weights.h"

#include "model/attention.h"
#include "loader/shard.h"
#include "model/registry.h"

namespace moe {

TensorRead embed_read(const ModelConfig& c) {
  return {ModelKeys().embed + ".weight", {c.vocab_size, c.hidden_size}, ShardRule::replicated()};
}

TensorRead embed_read(const ModelConfig& c, std::pair<int64_t, int64_t> vocab) {
  TensorRead r = embed_read(c);
  r.rule = ShardRule::column().window(vocab.first, vocab.second - vocab.first);
  return r;
}

TensorRead final_norm_read(const ModelConfig& c) { return norm_read(ModelKeys().final_norm, c.hidden_size); }

std::optional<LinearRead> lm_head_read(const ModelConfig& c) {
  if (c.tie_embeddings) return std::nullopt;
  return linear_read(ModelKeys().lm_head, c.vocab_size, c.hidden_size, /*bias=*/false);
}

std::optional<LinearRead> lm_head_read(const ModelConfig& c, std::pair<int64_t, int64_t> vocab) {
  auto r = lm_head_read(c);
  if (r) r->weight.rule = ShardRule::column().window(vocab.first, vocab.second - vocab.first);
  return r;
}

std::pair<int64_t, int64_t> vocab_range(int64_t V, int r, int n) { return {V * r / n, V * (r + 1) / n}; }

TensorRead input_norm_read(const ModelConfig& c, int64_t l) {
  return norm_read(ModelKeys().input_norm(l), c.hidden_size, l);
}

TensorRead post_attn_norm_read(const ModelConfig& c, int64_t l) {
  return norm_read(ModelKeys().post_attn_norm(l), c.hidden_size, l);
}

std::vector<TensorRead> model_reads(const ModelConfig& c, int tp_rank, int tp, bool vocab_parallel) {
  const FamilyHooks& fam = find_family(c.model_type);
  const std::pair<int64_t, int64_t> vocab = vocab_range(c.vocab_size, tp_rank, tp);
  std::vector<TensorRead> out = {vocab_parallel ? embed_read(c, vocab) : embed_read(c), final_norm_read(c)};
  if (const auto lm = vocab_parallel ? lm_head_read(c, vocab) : lm_head_read(c)) out.push_back(lm->weight);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    out.push_back(input_norm_read(c, l));
    out.push_back(post_attn_norm_read(c, l));
    for (TensorRead& r : attention_reads(c, fam.attention_keys(c, l), tp_rank, tp).all()) out.push_back(std::move(r));
  }
  return out;
}

std::vector<double> layer_held_bytes(const ModelConfig& c, int tp_rank, int tp, double weight_bytes) {
  std::vector<double> out(c.n_layers, 0);
  for (const TensorRead& r : model_reads(c, tp_rank, tp)) {
    if (r.layer < 0 || r.layer >= c.n_layers) continue;  // embeddings, final norm, lm_head
    double n = 1;
    for (int64_t d : plan_shard(r).out_shape) n *= static_cast<double>(d);
    out[r.layer] += n * (r.shape.size() >= 2 ? weight_bytes : 4.0);
  }
  return out;
}

}  // namespace moe
