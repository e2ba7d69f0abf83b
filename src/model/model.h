// A whole decoder model on one rank of a parallel layout: embedding, layers
// (attention + dense MLP or MoE block), final norm, lm_head, and the KV cache.
//
// Parallel layouts (ModelOptions::par over `world`, see comm/groups.h):
//   world 1                 everything local; MoE through MoeLayer::forward.
//   --ep N (dp 1)           attention replicated (or TP, below): every rank runs the
//                           same tokens; MoE through EpMoeLayer::forward_replicated.
//   --tp T                  attention heads split over the MoE-TP group (T consecutive
//                           ranks): q/k/v column-parallel, o_proj row-parallel +
//                           all-reduce over that group; MoE as above (experts split
//                           ep ways, each expert's I split T ways).
//   --ep N --attn-tp N      attention heads (and GQA's KV cache) split over the EP
//                           group, which is the world; each routed expert whole on its
//                           EP rank; shared experts and dense MLPs split like a
//                           column/row-parallel pair; every MoE layer ends in one
//                           all-reduce of routed + shared partials (allreduce strategy,
//                           EpOptions::shared_partial; the all-to-all strategies and
//                           --dp: EpMoeLayer::forward_attn_tp); lm_head vocabulary-
//                           parallel, its logits all-gathered. (The vLLM layout of the
//                           seed 003.) With --dp D the group is each replica.
//   --dp D                  D replicas (blocks of world/D ranks) each run their own
//                           requests; MoE through EpMoeLayer::forward (own tokens).
//                           Every rank must call forward() the same number of times,
//                           with 0 tokens when it has nothing to do (lock-step).
// Not thread-safe: one thread drives a model (kernels use OpenMP inside).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/groups.h"
#include "loader/moe_weights.h"
#include "model/attention.h"
#include "model/batch.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "moe/ep_layer.h"
#include "moe/eplb.h"
#include "moe/eplb_online.h"
#include "moe/fused_moe.h"

namespace moe {

struct ModelOptions {
  DType dtype = DType::F32;  // weights: f32 or bf16 (f32 activations and accumulation)
  // --quantize w8a8: the routed experts of every MoE layer become W8A8 int8
  // (MlpLoadOptions::quantize_w8a8: per-output-channel weight scales, per-token dynamic
  // activation scales, smooth = 1); the router stays f32, and the shared experts, dense
  // MLPs, attention, embedding and lm_head stay in `dtype`. Under MoE-TP each rank quantises its I slice
  // (W2's channel scales and GEMM2's activation scales cover that slice only), so the
  // result is close to, not bitwise equal to, the one-rank W8A8 model.
  bool quantize_w8a8 = false;
  // --quantize w4a8 / --int4-group: the routed experts become W4A8 int4 instead
  // (MlpLoadOptions::quantize_w4a8); everything else as for w8a8.
  bool quantize_w4a8 = false;
  int64_t int4_group = 32;
  // GGUF weights of integer-coded types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
  // stay in their codes, exactly (4-bit types in 4 bits, 5- and 6-bit ones in 6, Q8_0 in 8;
  // loader/gguf/gguf_experts.h): the routed experts (MlpLoadOptions::gguf_q4_0_as_int4),
  // dense and shared MLPs, and, unless quantize_linears asks for int8, the attention
  // projections and lm_head (load_linear). false: dequantised to `dtype` (f32 holds them
  // exactly). (The name is older than the K-quants.)
  bool gguf_q4_0_as_int4 = true;
  // --quantize-linears w8a8: the attention projections and lm_head become W8A8 int8
  // (model/layers.h Linear: per-output-channel weight scales at load, per-token dynamic
  // input scales). MLA's kv_b (absorbed into the attention) stays f32, unrounded, and the
  // embedding stays in dtype.
  // Attention is replicated or head-split per rank, so EP invariance is unaffected; under
  // --tp a row-parallel projection (o_proj) quantises its input slice per rank.
  bool quantize_linears = false;
  // --quantize-linears w4a8: the same projections and lm_head become W4A8 int4 instead,
  // with zero points and groups of int4_group inputs (LinearOptions::int4_group), int8
  // inputs per token as W8A8's. Fewer bytes per decode step than int8 (0.66 byte per
  // weight against 1.0 at groups of 32), a slower GEMM at prefill.
  bool quantize_linears_w4a8 = false;
  int64_t n_slots = 1;       // sequences the KV cache holds
  int64_t max_seq = 0;       // positions per sequence (0: max_position_embeddings)
  int64_t kv_block_size = 16;  // positions per KV block (model/kv_cache.h)
  // false: a fixed region of max_seq positions per slot. true: one pool of blocks that
  // any slot can use (the owner hands them out, KvCache::set_blocks), of kv_cache_bytes
  // (0: enough for n_slots x max_seq, capped at kDefaultPagedKvBytes).
  bool paged_kv = false;
  uint64_t kv_cache_bytes = 0;
  // --kv-cache-dtype: f32, or bf16 (KvCacheShape::dtype: half the bytes; kv_cache_bytes
  // then holds twice the blocks).
  DType kv_cache_dtype = DType::F32;
  static constexpr uint64_t kDefaultPagedKvBytes = uint64_t{4} << 30;
  Communicator* world = nullptr;  // nullptr or size 1: one rank; must outlive the model
  ParallelConfig par;
  EpOptions ep;
  // Expert placement and load balancing under --ep > 1 (moe/eplb.h): redundant slots,
  // a placement file, online rebalancing. Rebalancing turns count_experts on.
  EplbOptions eplb;
  // Keep per-layer expert load counts, from the layers' own routing (no extra router
  // GEMM, except under --ep with replicated attention where a step takes the
  // sequence-parallel path: allgather, or more tokens than --max-tokens-per-rank).
  bool count_experts = false;
  // Rank 0 prints the load's progress (loads of 256 MB and more); the verbs' --quiet
  // turns it off.
  bool show_progress = true;
  // --weights-cache DIR: the packed weights (routed experts, MLP blocks, attention
  // projections, lm_head) are mapped from this rank's cache file when it is valid, and
  // written there when they had to be packed (loader/weights_cache/weights_cache.h).
  // Empty: no cache. Not with moe_weights.
  std::string weights_cache_dir;
  // When set, MoE layers take their weights from this instead of the checkpoint (which
  // then needs no MLP tensors for them): generated models (`moe-ep bench-model`). Gets
  // the layer and the loader options Model::load would use (experts [expert_begin,
  // expert_end), expert_end -1 = all; tp_rank/tp_size; compute dtype).
  std::function<MoeLayerWeights(int64_t layer, const MlpLoadOptions&)> moe_weights;
};

// What --weights-cache did at load: records mapped from the file (hits) and packed
// (misses: then the file was rewritten, `bytes_written`).
struct WeightsCacheStats {
  size_t hits = 0, misses = 0;
  uint64_t bytes_mapped = 0, bytes_written = 0;
};

struct DecoderLayer {
  Tensor input_norm, post_norm;  // f32 [H]
  std::unique_ptr<GqaAttention> gqa;
  std::unique_ptr<MlaAttention> mla;
  std::optional<GatedMlpWeights> dense;  // dense-MLP layers
  std::unique_ptr<MoeLayer> moe;         // MoE layers, single rank
  std::unique_ptr<EpMoeLayer> ep_moe;    // MoE layers, several ranks
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& opt);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  const WeightsCacheStats& weights_cache_stats() const { return cache_stats_; }
  // Runs the decoder on a prepared step (model/batch.h); writes the step's K/V into
  // the cache and returns logits [batch.logit_rows.size(), vocab] f32.
  Tensor forward(const StepBatch& b);

  KvCache& cache() { return cache_; }
  // Decoder layer i's weights (for inspection).
  const DecoderLayer& layer(int64_t i) const { return layers_.at(static_cast<size_t>(i)); }
  // Tokens routed to each expert so far, [n_layers][E] (empty rows for dense layers),
  // counted on this rank's tokens (ModelOptions::count_experts).
  const std::vector<std::vector<int64_t>>& expert_load() const { return expert_load_; }
  // Zeroes those counts (and the rebalancing window, which reads them).
  void reset_expert_load();
  // The EP statistics of the last forward(), summed over its MoE layers (zero on one rank).
  EpStats ep_stats() const;
  // The placement of MoE layer l's experts (contiguous blocks on one rank), and what
  // online rebalancing did (nullptr without --eplb-interval).
  const Placement& placement(int64_t l) const;
  const EplbReport* eplb_report() const { return eplb_ ? &eplb_->report() : nullptr; }
  // Bytes the token embedding holds: the checkpoint's (a view, or a GGUF quantised
  // tensor's blocks) unless it had to be converted at load.
  size_t embedding_bytes() const { return embed_.nbytes(); }
  // Turns the expert load counting of ModelOptions::count_experts on or off.
  void set_count_experts(bool on) { opt_.count_experts = on; }

  int world_size() const { return world_ ? world_->size() : 1; }
  int rank() const { return world_ ? world_->rank() : 0; }
  int dp_size() const { return opt_.par.dp; }
  int dp_rank() const { return groups_ ? groups_->dp_rank() : 0; }
  Communicator* world() { return world_; }
  // The ranks of this rank's DP replica (they hold the same requests); nullptr on one rank.
  Communicator* replica() { return groups_ ? &groups_->dp_attn() : nullptr; }

 private:
  Model() = default;
  void mlp(DecoderLayer& L, int64_t layer, const Tensor& x, float* y);
  // --attn-tp: this rank's vocabulary rows of x [n, H] through lm_head, all-gathered
  // into logits [n, V]; rows with a top_k limit (StepBatch::logit_top_k) gather only
  // each rank's k best.
  void gather_vocab_logits(const float* x, int64_t n, const std::vector<int32_t>& top_k, float* logits);

  ModelConfig cfg_;
  ModelOptions opt_;
  WeightsCacheStats cache_stats_;
  Communicator* world_ = nullptr;
  std::unique_ptr<ParallelGroups> groups_;
  Communicator* tp_ = nullptr;  // attention TP group (size par.tp or par.attn_tp), nullptr if 1
  Communicator* attn_tp_ = nullptr;  // --attn-tp: that group, which also splits MLPs and vocab
  std::pair<int64_t, int64_t> vocab_;  // embedding and lm_head rows this rank holds [first, second)
  // [V_r, H] checkpoint dtype (a view of the mapping), or U8 blocks (below): the rows
  // vocab_ of the embedding (all of them but under --attn-tp)
  Tensor embed_;
  int32_t embed_ggml_ = -1;      // >= 0: embed_ is a GGUF quantised token_embd of this ggml type, V rows
  uint64_t embed_row_bytes_ = 0;  // of embed_row_bytes_ bytes each, dequantised per token
  Tensor final_norm_;            // f32 [H]
  Linear lm_head_;               // [V, H], or this rank's [V_r, H] under --attn-tp
  std::vector<DecoderLayer> layers_;
  Rope rope_;  // positions -> cos/sin tables (all layers share one RoPE)
  KvCache cache_;
  std::vector<std::vector<int64_t>> expert_load_;
  std::unique_ptr<OnlineEplb> eplb_;
  Placement one_rank_placement_;  // placement() of one-rank layers (contiguous)
  // Scratch, grown as needed. step_*: f32 [T, H] of the last forward() (residual
  // stream, normed input, layer output) and [logit rows, H]; see step_buffer().
  Tensor step_h_, step_xn_, step_tmp_, step_last_, step_vocab_;
  // --attn-tp: this rank's part of the logits gather, and every rank's, rank after rank
  // (per row: [V_r] f32, or k (f32 value, i32 id) pairs).
  std::vector<char> vocab_send_, vocab_gather_;
  std::vector<int32_t> vocab_order_;  // --attn-tp: a row's local ids, ordered to pick its k best
  AttnScratch attn_s_;
  MoeScratch mlp_s_;
  LinearScratch lin_s_;
  RopeTables rope_tab_;
};

}  // namespace moe
