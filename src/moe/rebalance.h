// EpMoeLayer's rebalance in flight (moe/rebalance.cpp). Internal header.
#pragma once

#include <memory>
#include <vector>

#include "moe/ep_layer.h"

namespace moe {

struct EpMoeLayer::Pending {
  Placement next;
  MoeLayerWeights w;                // this rank's slots under next
  std::vector<std::vector<char>> send, recv;  // one blob per message
  std::vector<int64_t> recv_slot;   // local slot (under next) of each receive
  std::unique_ptr<CommRequest> req;
  RebalanceStats stats;
};

}  // namespace moe
