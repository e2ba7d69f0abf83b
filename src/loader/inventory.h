// What a checkpoint holds and what each rank reads of it: the tensor inventory by
// kind, and the per-rank read plan for an --ep/--tp layout (used by `moe-ep inspect`
// and by the tests that check bytes read per rank).
#pragma once

#include <cstdint>
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
  uint64_t non_expert_bytes = 0;  // every tensor but the routed experts (replicated)
  uint64_t expert_bytes = 0;      // this rank's experts (its MoE-TP slice), as the loader views them
  uint64_t header_bytes = 0;
  uint64_t resident_expert_bytes = 0;  // packed expert weights in memory at the compute dtype
  uint64_t read_bytes() const { return non_expert_bytes + expert_bytes + header_bytes; }
};
// The plan for world = ep * tp ranks (contiguous expert blocks, as Placement::contiguous).
// Throws if tp does not divide the experts' I.
std::vector<RankPlan> read_plan(const Checkpoint& ck, const MoeConfig& cfg, const Inventory& inv, int ep, int tp,
                                DType compute);

// Every missing / mis-shaped / wrong-dtype / unexpected tensor of every layer's MLP
// block (plus layers the config does not have). Headers only.
std::vector<TensorProblem> check_checkpoint(const Checkpoint& ck, const MoeConfig& cfg);

}  // namespace moe
