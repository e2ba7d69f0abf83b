// Every checkpoint tensor a whole model reads outside its MLP blocks, with the rule
// that slices it for one TP rank. Model::load loads through these descriptions and
// `moe-ep inspect` checks and plans with model_reads(), so the two cannot disagree on
// a name, a shape or a slice. (The MLP blocks have their own list in the loader:
// loader/moe_weights.h mlp_layer_reads.)
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "loader/shard.h"
#include "model/layers.h"
#include "model/model_config.h"

namespace moe {

TensorRead embed_read(const ModelConfig& c);       // [V, H], replicated
// Vocabulary-parallel: rows [vocab.first, vocab.second) of the embedding only.
TensorRead embed_read(const ModelConfig& c, std::pair<int64_t, int64_t> vocab);
TensorRead final_norm_read(const ModelConfig& c);  // [H]
// [V, H], replicated; none when tie_word_embeddings (the embeddings serve as lm_head).
std::optional<LinearRead> lm_head_read(const ModelConfig& c);
// Vocabulary-parallel: rows [vocab.first, vocab.second) of lm_head (a window of the
// output dim, read as a view where the dtype allows).
std::optional<LinearRead> lm_head_read(const ModelConfig& c, std::pair<int64_t, int64_t> vocab);
// The vocabulary rows rank r of n holds: [V*r/n, V*(r+1)/n) (V need not divide by n).
std::pair<int64_t, int64_t> vocab_range(int64_t V, int r, int n);
TensorRead input_norm_read(const ModelConfig& c, int64_t layer);      // [H]
TensorRead post_attn_norm_read(const ModelConfig& c, int64_t layer);  // [H]

// All of the above plus every layer's attention (attention_reads) on TP rank
// `tp_rank` of `tp`, in the order Model::load reads them. Throws if tp does not divide
// the attention heads. vocab_parallel (--attn-tp): the embedding's and lm_head's rows
// vocab_range(V, tp_rank, tp) only.
std::vector<TensorRead> model_reads(const ModelConfig& c, int tp_rank, int tp, bool vocab_parallel = false);

// Per decoder layer, the bytes of its norms and attention that rank `tp_rank` of `tp`
// holds (model_reads' slices): 2-D weights at `weight_bytes` per value, 1-D tensors in
// f32, as the engine keeps them. `moe-ep plan` and `bench-model` count with it.
std::vector<double> layer_held_bytes(const ModelConfig& c, int tp_rank, int tp, double weight_bytes);

}  // namespace moe
