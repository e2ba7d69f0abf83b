// Token sampling: greedy, or temperature / top-k / top-p with a counter-based RNG.
//
// The random number of a draw depends only on (seed, request index, step): no
// generator state is carried between draws, so the same seed gives the same tokens
// whatever the batch composition, the DP replica a request lands on, or the number
// of ranks (given the same logits).
#pragma once

#include <cstdint>

namespace moe {

struct SamplingParams {
  double temperature = 0;  // <= 0: greedy (argmax, ties to the lower id)
  int64_t top_k = 0;       // 0: no top-k filter
  double top_p = 1.0;      // 1: no nucleus filter
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0; }
};

// A uniform double in [0, 1) from (seed, request, step) (splitmix64 finaliser).
double counter_uniform(uint64_t seed, uint64_t request, uint64_t step);

// Picks a token from logits[V]. Deterministic for the same inputs.
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t request, uint64_t step);

}  // namespace moe
