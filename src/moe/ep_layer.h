// One MoE block under expert parallelism: the routed experts are split over the
// ranks, tokens travel to their experts and back through one of four strategies.
//
// Token contracts (what `x` means on each rank):
//   allreduce               every rank holds the SAME tokens and gets the same y.
//   allgather, alltoall,    each rank holds ITS OWN tokens (counts may differ, even
//   alltoall-ll             be 0) and gets the output of its own tokens.
// The caller (CLI, model runner) lays tokens out accordingly.
//
// EP invariance: alltoall and alltoall-ll send every (token, expert) slot to the
// rank owning the expert, return each slot's expert output to the source, and sum
// the k slots there in slot order j = 0..k-1. With tp = 1 the result is bitwise
// identical to the single-rank MoeLayer::forward for every EP size, because the
// grouped GEMM is batch-invariant (a row's result does not depend on the other
// rows; see kernels/grouped_gemm.h) and the combine order is fixed.
//
// Collectives: every rank must call forward() the same number of times (chunked
// mode keeps that true by running the same number of rounds everywhere).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "moe/fused_moe.h"
#include "moe/placement.h"

namespace moe {

enum class MoeComm : uint8_t { AllReduce, AllGather, AllToAll, AllToAllLL, Auto };
MoeComm parse_moe_comm(const std::string& name);  // allreduce, allgather, alltoall, alltoall-ll, auto
const char* moe_comm_name(MoeComm c);

struct EpOptions {
  MoeComm comm = MoeComm::Auto;
  // alltoall-ll: tokens one rank may send per call; sizes the fixed buffers.
  int64_t max_tokens_per_rank = 64;
  // > 0: run the block over chunks of at most this many tokens per rank, so that
  // dispatch buffers stay bounded; every rank runs the same number of rounds.
  int64_t chunk_tokens = 0;
  // Run the shared experts while the routed experts' communication is in flight.
  bool overlap = true;
  // Attention TP over the EP group (--attn-tp): this rank's shared experts hold a slice
  // of their intermediate size, so the strategies do not run them (dispatch::SharedRun);
  // allreduce adds their partial output to the routed partial before its one all-reduce
  // (no overlap: the sum needs both), EpMoeLayer::forward_attn_tp sums them otherwise.
  bool shared_partial = false;
};

// Where the time of the last forward() went, summed over its chunks.
struct EpStats {
  double total_s = 0;
  double compute_s = 0;   // gate, routing, packing, experts, combine (not shared)
  double shared_s = 0;    // shared experts (overlapped with comm when enabled)
  // When the last call's shared experts ran (steady clock, now_s): they overlap
  // the communication when this lies inside the wait (tests/test_shared_overlap.cpp).
  double shared_begin_s = 0, shared_end_s = 0;
  double comm_wait_s = 0;  // time blocked in communication
  double bytes_sent = 0;   // payload bytes this rank sent (both directions)
  double dispatch_bytes = 0;  // of bytes_sent: the dispatch direction (alltoall, alltoall-ll)
  int64_t rounds = 0;
  int64_t rows = 0;  // (token, expert) rows this rank's expert slots computed
  MoeComm used = MoeComm::Auto;
  void reset() { *this = EpStats{}; }
};

// The rank-local half of a strategy; defined in moe/dispatch/*.cpp.
class MoeStrategy {
 public:
  virtual ~MoeStrategy() = default;
  // y [T, H] f32 for this rank's x [T, H] (contract per strategy, see above).
  virtual void forward(const Tensor& x, float* y, EpStats& stats) = 0;
};

// What one online rebalance moved (EpMoeLayer::begin_rebalance / finish_rebalance).
struct RebalanceStats {
  int64_t slots_received = 0;  // slots this rank got from another rank
  int64_t slots_copied = 0;    // slots it already held (copied locally)
  double bytes_sent = 0, bytes_received = 0;
  double begin_s = 0;  // begin_rebalance: allocation, local copies, posting the messages
  double finish_s = 0;  // finish_rebalance: the wait for what was still in flight, the switch
};

class EpMoeLayer {
 public:
  // `layer` holds this rank's expert slots (placement.begin..end of its EP rank, and
  // under MoE-TP its slice of I) plus the full gate and shared experts.
  // `world` must outlive this object.
  EpMoeLayer(MoeLayer layer, Communicator& world, Placement placement, EpOptions opt);
  ~EpMoeLayer();

  // Online rebalancing, in two phases so that steps keep running on the current slots
  // while the weights that change owner travel (double-buffered):
  //  begin_rebalance allocates this rank's slots under `next`, copies the experts it
  //    already holds, and posts point-to-point messages for the others (a slot of
  //    expert e that this rank lacks comes from the holder of e's replica
  //    (dst EP rank mod replicas) under the current placement, between the same MoE-TP
  //    ranks). OpenMPI moves them during the MPI calls of the steps that follow.
  //  finish_rebalance waits for what is still in flight and switches to `next`.
  // Every rank must call both with the same `next`, at the same steps. The output of
  // the all-to-all strategies stays bitwise the same: the slots hold byte copies.
  void begin_rebalance(Placement next);
  bool rebalance_pending() const;
  RebalanceStats finish_rebalance();

  Tensor forward(const Tensor& x);
  // Every rank holds the same x [T, H] and gets the same y (replicated or TP
  // attention feeding EP experts). allreduce runs on x as it is; the all-to-all
  // strategies and auto at decode sizes (T <= --max-tokens-per-rank, tp = 1, not
  // chunked, rows that one quantisation serves) run the slot gather: each rank
  // computes the (token, k) choices its slots hold and one all-gather shares them;
  // otherwise each rank takes an even share of the rows (sequence parallel), runs the
  // strategy, and the outputs are all-gathered.
  Tensor forward_replicated(const Tensor& x);
  // Attention TP over the EP group (--attn-tp; EpOptions::shared_partial): every rank of
  // `group` (the attention-TP group: the world, or a DP replica) holds the same x
  // [T, H]; each holds a slice of the shared experts. allreduce over the whole world:
  // forward_replicated (routed + shared partials in one all-reduce). Otherwise each rank
  // of the group takes an even share of the rows and runs forward() on it (own tokens,
  // every rank of the world at once: the DP replicas too), the shared slices of all T
  // rows are reduce-scattered onto the same shares, and the group all-gathers y.
  Tensor forward_attn_tp(const Tensor& x, Communicator& group);
  // Whether forward_attn_tp routes all T rows on this rank (for count_routed).
  bool attn_tp_routes_all(const Communicator& group) const {
    return opt_.comm == MoeComm::AllReduce && group.size() == world_.size();
  }
  // Whether forward_replicated of T tokens routes all T on this rank (allreduce and the
  // slot gather do; the sequence-parallel path routes this rank's share only), so that
  // the layer's count_routed sees every token.
  bool replicated_routes_all(int64_t T) const {
    return opt_.comm == MoeComm::AllReduce || world_.size() == 1 || slot_gather_applies(T);
  }
  const EpStats& stats() const { return stats_; }
  MoeLayer& local() { return layer_; }
  const Placement& placement() const { return placement_; }
  const EpOptions& options() const { return opt_; }
  void set_overlap(bool on) { opt_.overlap = on; }
  Communicator& comm() { return world_; }
  // The strategy `auto` resolves to for a call where the largest rank holds max_tokens.
  MoeComm resolve(int64_t max_tokens) const;

 private:
  MoeStrategy& strategy(MoeComm c);
  bool slot_gather_applies(int64_t T) const;
  // forward() with every rank's token count given (nullptr: all-gathered here).
  Tensor forward_counts(const Tensor& x, const std::vector<int64_t>* counts);
  void attach_placement();
  struct Pending;

  MoeLayer layer_;
  Communicator& world_;
  Placement placement_;
  EpOptions opt_;
  EpStats stats_;
  std::unique_ptr<MoeStrategy> strategies_[4];
  std::unique_ptr<MoeStrategy> slot_gather_;
  std::unique_ptr<Pending> pending_;
  std::vector<int64_t> replicated_counts_;  // forward_replicated's shares, [R]
  std::vector<int64_t> gathered_counts_;    // forward's all-gathered counts, [R]
  Tensor shared_all_, shared_own_;          // forward_attn_tp: f32 [T, H] slices, [share, H] summed
};

// Factories (moe/dispatch/*.cpp).
std::unique_ptr<MoeStrategy> make_allreduce(EpMoeLayer& ep);
std::unique_ptr<MoeStrategy> make_allgather(EpMoeLayer& ep);
std::unique_ptr<MoeStrategy> make_alltoall(EpMoeLayer& ep);
std::unique_ptr<MoeStrategy> make_alltoall_ll(EpMoeLayer& ep);
// forward_replicated's decode path (moe/dispatch/slot_gather.cpp): same tokens on every
// rank, tp = 1; one all-gather of per-choice outputs.
std::unique_ptr<MoeStrategy> make_slot_gather(EpMoeLayer& ep);

}  // namespace moe
