// One step of the served model, as rank 0's scheduler decides it and every rank runs
// it: the batch (model/batch.h) plus the KV blocks of each sequence in it. Rank 0
// broadcasts the plan before the step; the other ranks receive it and run exactly that
// forward, so every collective of every MoE layer is matched (lock-step).
#pragma once

#include <cstdint>
#include <vector>

#include "model/batch.h"

namespace moe {
class Communicator;
}

namespace moe::serve {

enum class PlanKind : int64_t {
  idle = 0,  // nothing to run: a heartbeat, so a waiting rank's bounded wait never expires
  step = 1,  // run `batch`
  stop = 2,  // shut down cleanly: every rank exits 0
};

struct StepPlan {
  PlanKind kind = PlanKind::idle;
  StepBatch batch;
  // blocks[i]: the KV blocks of batch.seqs[i]'s slot, in position order.
  std::vector<std::vector<int32_t>> blocks;
};

// Collective over `world`: rank 0's `plan` is copied to every rank (two broadcasts: a
// fixed header of sizes, then one packed array of int32 words).
void broadcast_plan(Communicator& world, StepPlan& plan);

}  // namespace moe::serve
