// EpMoeLayer's rebalance in flight (moe/rebalance.cpp). Internal header.
#pragma once

#include <memory>
#include <vector>

#include "moe/ep_layer.h"

namespace moe {

struct EpMoeLayer::Pending {
  Placement next;
  MoeLayerWeights w;                // this rank's slots under next
  std::unique_ptr<CommRequest> req;  // the slots' pieces in flight (into w, from the current slots)
  RebalanceStats stats;
};

}  // namespace moe
