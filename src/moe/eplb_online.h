// Online expert-parallel load balancing (--eplb-interval): every `interval` steps
// every rank all-reduces the window of expert load statistics, computes the same
// new placement per MoE layer from it (eplb_place + eplb_keep_in_place, deterministic),
// and begins moving the slots that change owner (EpMoeLayer::begin_rebalance); one
// step later, while that step's MPI calls have carried the messages, it switches
// (finish_rebalance). Every rank must call after_step() after every step, as the
// steps themselves are lock-step.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "moe/ep_layer.h"
#include "moe/eplb.h"
#include "moe/load_window.h"

namespace moe {

// What the rebalances of a run did (summed; imbalance of the last one, mean over layers).
struct EplbReport {
  int64_t rebalances = 0;    // decisions taken (every --eplb-interval steps), moving slots or not
  int64_t slots_moved = 0;   // over all ranks and layers
  double bytes_moved = 0;    // sent by all ranks
  double stall_s = 0;        // this rank's step loop blocked in begin + finish, summed
  double max_stall_s = 0;    // the longest single rebalance's (begin + finish) on this rank
  double imbalance_before = 0, imbalance_after = 0;  // last rebalance, mean over layers
  int64_t last_step = -1;
};

class OnlineEplb {
 public:
  // layers[l] is the EP layer of decoder layer l or nullptr (dense); params.ep and
  // the layers' placements must agree. world: the EP world (all ranks).
  OnlineEplb(const EplbOptions& opt, const EplbParams& params, Communicator& world, std::vector<EpMoeLayer*> layers,
             const std::vector<std::vector<int64_t>>& counters);

  void after_step(const std::vector<std::vector<int64_t>>& cumulative);
  // The counters were reset (to `cumulative`): the window starts over.
  void counters_reset(const std::vector<std::vector<int64_t>>& cumulative) { window_.clear(cumulative); }
  const LoadWindow& window() const { return window_; }
  const EplbReport& report() const { return report_; }
  int64_t steps() const { return step_; }

 private:
  void begin();
  void finish();

  EplbOptions opt_;
  EplbParams params_;
  Communicator& world_;
  std::vector<EpMoeLayer*> layers_;
  LoadWindow window_;
  int64_t step_ = 0;
  bool pending_ = false;
  EplbReport report_;
};

}  // namespace moe
