// What a checkpoint holds and what each rank reads of it: the tensor inventory by
// kind, every missing / mis-shaped / unexpected tensor, and the per-rank read plan for
// an --ep/--tp layout (used by `moe-ep inspect` and by the tests that check bytes read
// per rank). The tensors outside the MLP blocks come from the model's own list
// (model/weights.h), passed in, so the plan and the checks are what the model reads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "moe/config.h"

namespace moe {

enum class TensorKind { Attention, DenseMlp, Experts, SharedExperts, Router, Norm, Embedding, LmHead, Other };
const char* tensor_kind_name(TensorKind k);
// By the key's name alone (quantisation scales count with the module they scale).
TensorKind classify_tensor(const std::string& key);

struct KindTotals {
  int64_t count = 0;
  uint64_t bytes = 0;
};

struct Inventory {
  std::map<TensorKind, KindTotals> kinds;
  int64_t n_tensors = 0;
  uint64_t tensor_bytes = 0;  // sum of every tensor's bytes
  uint64_t file_bytes = 0;    // sum of the shard files' sizes
  uint64_t header_bytes = 0;  // sum over shards of 8 + header length
  size_t n_files = 0;
  uint64_t non_expert_bytes() const;
};
// Opens every shard (headers only) and sums the tensors by kind.
Inventory take_inventory(const Checkpoint& ck);

struct RankPlan {
  int rank = 0, ep_rank = 0, tp_rank = 0;
  int64_t expert_begin = 0, expert_end = 0;
  // Everything the rank reads but the routed experts: embeddings, norms, lm_head, its TP
  // slice of the attention, routers, shared experts, dense MLPs.
  uint64_t non_expert_bytes = 0;
  uint64_t expert_bytes = 0;      // this rank's experts (its MoE-TP slice of each)
  uint64_t header_bytes = 0;
  uint64_t resident_expert_bytes = 0;  // packed expert weights in memory at the compute dtype (FP8 in bf16: 1 B, scales aside)
  uint64_t read_bytes() const { return non_expert_bytes + expert_bytes + header_bytes; }
};
// The tensors outside the MLP blocks that a rank of TP rank `tp_rank` of `tp` reads
// (model/weights.h model_reads; the loader does not know the model's attention).
using NonMlpReads = std::function<std::vector<TensorRead>(int tp_rank, int tp)>;
// The plan for world = ep * tp ranks (contiguous expert blocks, as Placement::contiguous),
// every byte counted as load_sharded reads it. Throws if tp does not divide the
// experts' I (or a tensor that --tp slices). attn_tp > 1 (--attn-tp, which needs
// ep = attn_tp and tp = 1): rank r reads non_mlp(r, attn_tp) and its 1/attn_tp of the
// shared experts and dense MLPs (MlpLoadOptions::mlp_tp_*).
std::vector<RankPlan> read_plan(const Checkpoint& ck, const MoeConfig& cfg, const Inventory& inv, int ep, int tp,
                                DType compute, const NonMlpReads& non_mlp, int attn_tp = 1);

// Every problem of the checkpoint, headers only: each missing / mis-shaped / wrong-
// dtype tensor of `non_mlp` (the reads outside the MLP blocks) and of every layer's
// MLP block, and every tensor that nothing reads (unexpected), including layers the
// config does not have.
std::vector<TensorProblem> check_checkpoint(const Checkpoint& ck, const MoeConfig& cfg,
                                            const std::vector<TensorRead>& non_mlp);

// The keys of the MTP layers the config declares (num_nextn_predict_layers: layers
// [n_layers, n_layers + n_mtp_layers)), which the engine skips; and the keys of layers
// past those, which the config does not know at all.
std::vector<std::string> mtp_layer_keys(const Checkpoint& ck, const MoeConfig& cfg);
std::vector<std::string> beyond_layer_keys(const Checkpoint& ck, const MoeConfig& cfg);

// Reads one rank's share as the engine does and drops it: every tensor of `non_mlp`
// through load_sharded, then every layer's MLP block through load_moe_layer /
// load_dense_mlp with `opt` (packed), or with pack = false each MLP tensor's slice
// copied as it is (the I/O path alone). Advances opt.progress. The bytes read are
// ck.bytes_touched(): `moe-ep inspect --load` and the tests compare them to the plan.
void load_share(const Checkpoint& ck, const MoeConfig& cfg, const std::vector<TensorRead>& non_mlp,
                const MlpLoadOptions& opt, bool pack);

}  // namespace moe
