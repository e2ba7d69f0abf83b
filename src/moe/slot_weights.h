// The weights of one rank's expert slots under any placement, assembled from loads of
// expert ranges (the loader and the generated models both load [begin, end) ranges).
#pragma once

#include <cstdint>
#include <functional>

#include "moe/fused_moe.h"
#include "moe/placement.h"

namespace moe {

// load_range(b, e) returns a layer's weights holding experts [b, e) (router, shared
// experts and the rest in full). Each run of consecutive expert ids among EP rank
// `ep_rank`'s slots is loaded once and its experts copied into the slots, so the rank
// holds only its slots' experts (plus, while one run is copied, that run's). The
// result's expert_begin/end and slot_expert are those of the placement.
MoeLayerWeights load_slot_weights(const Placement& p, int ep_rank,
                                  const std::function<MoeLayerWeights(int64_t, int64_t)>& load_range);

}  // namespace moe
