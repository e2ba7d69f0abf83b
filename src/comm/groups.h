// The parallel layout of a job: which ranks form the EP, MoE-TP and DP-attention
// groups (laid out as in xLLM).
//
//   world = ep * tp            (tp: the MoE tensor-parallel size, "moe_tp")
//   moe_tp group: a block of tp consecutive ranks        tp_rank = rank % tp
//   ep group:     ranks with the same tp_rank (stride tp) ep_rank = rank / tp
//   dp (DP attention, must divide world): a DP replica is a block of world/dp
//   consecutive ranks (its attention-TP group, communicator "dp");
//                 dp_rank = rank / (world/dp), attn_tp_rank = rank % (world/dp)
//   attn_tp (--attn-tp, the vLLM layout of the seed 003: attention tensor-parallel
//   over the EP group): attention heads, the shared experts and dense MLPs and the
//   vocabulary (embedding, lm_head) are split over the whole DP replica (attn_tp = world/dp,
//   the "dp" communicator), while every routed expert stays whole (tp must be 1).
//
// Example, world 4, --ep 2 --tp 2 --dp 2:
//   rank  ep_rank tp_rank dp_rank | moe_tp group  ep group  dp group
//   0     0       0       0       | {0,1}         {0,2}     {0,1}
//   1     0       1       0       | {0,1}         {1,3}     {0,1}
//   2     1       0       1       | {2,3}         {0,2}     {2,3}
//   3     1       1       1       | {2,3}         {1,3}     {2,3}
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace moe {

struct ParallelConfig {
  int ep = 1;  // --ep: expert-parallel size
  int tp = 1;  // --tp: MoE tensor-parallel size (an expert's I dimension split tp ways)
  int dp = 1;  // --dp: data-parallel attention replicas
  // --attn-tp: attention TP over the EP group, experts whole (1: off; else world/dp).
  int attn_tp = 1;
};

// Throws moe::Error naming the flags when `cfg` does not fit `world_size` ranks,
// e.g. "--ep 3 --tp 2 needs 6 ranks, mpirun started 4".
void validate_parallel_config(const ParallelConfig& cfg, int world_size);

// "--ep 2 --tp 1 --dp 1" (and " --attn-tp N" when it is on)
std::string to_string(const ParallelConfig& cfg);

class ParallelGroups {
 public:
  // Collective over `world` (every rank must construct it with the same cfg).
  // `world` is not owned and must outlive this object.
  ParallelGroups(Communicator& world, const ParallelConfig& cfg);

  const ParallelConfig& config() const { return cfg_; }
  Communicator& world() const { return *world_; }
  Communicator& ep() const { return *ep_; }          // size ep, rank ep_rank
  Communicator& moe_tp() const { return *moe_tp_; }  // size tp, rank tp_rank
  Communicator& dp_attn() const { return *dp_; }     // size world/dp, rank attn_tp_rank

  int ep_rank() const { return ep_rank_; }
  int tp_rank() const { return tp_rank_; }
  int dp_rank() const { return dp_rank_; }
  int attn_tp_rank() const { return attn_tp_rank_; }

  // The world rank holding (ep_rank, tp_rank).
  static int world_rank_of(const ParallelConfig& cfg, int ep_rank, int tp_rank) { return ep_rank * cfg.tp + tp_rank; }

 private:
  ParallelConfig cfg_;
  Communicator* world_;
  std::unique_ptr<Communicator> moe_tp_, ep_, dp_;
  int ep_rank_ = 0, tp_rank_ = 0, dp_rank_ = 0, attn_tp_rank_ = 0;
};

}  // namespace moe
