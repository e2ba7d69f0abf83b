// Token sampling: greedy, or temperature / top-k / top-p with a counter-based RNG.
//
// The random number of a draw depends only on (seed, request index, step): no
// generator state is carried between draws, so the same seed gives the same tokens
// whatever the batch composition, the DP replica a request lands on, or the number
// of ranks (given the same logits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

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

// The order every sampler ranks tokens in: higher logit first, NaN as -inf, ties to
// the lower id. A total order, so "the k best" of a row is one set (what a
// vocabulary-parallel lm_head's ranks each send, model/model.h).
inline float sort_key(float v) { return v == v ? v : -std::numeric_limits<float>::infinity(); }
inline bool logit_before(const float* logits, int32_t a, int32_t b) {
  const float x = sort_key(logits[a]), y = sort_key(logits[b]);
  return x > y || (x == y && a < b);
}

// How many of a row's best logits sample_token reads under p: 1 (greedy), top_k, or 0
// (the whole row).
inline int32_t sampled_top_k(const SamplingParams& p) {
  if (p.greedy()) return 1;
  return p.top_k > 0 && p.top_k <= std::numeric_limits<int32_t>::max() ? static_cast<int32_t>(p.top_k) : 0;
}

// The k best a row must bring (a vocabulary-parallel lm_head's per-rank limit) for a
// draw under p among the first V - padding ids: up to `padding` of the row's best may be
// ids past the tokenizer, which are never drawn. 0: the whole row.
inline int32_t gathered_top_k(const SamplingParams& p, int64_t padding) {
  const int32_t k = sampled_top_k(p);
  if (k == 0) return 0;
  return static_cast<int32_t>(std::min<int64_t>(k + padding, std::numeric_limits<int32_t>::max()));
}

// The greedy pick: the first id in logit_before order (highest logit, NaN lowest, ties to
// the lower id).
int32_t greedy_token(const float* logits, int64_t V);

// Picks a token from logits[V]. Deterministic for the same inputs. Only the
// max(top_k, 1) best logits in that order matter when top_k > 0 or greedy (a row that
// holds -inf elsewhere gives the same token).
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t request, uint64_t step);

}  // namespace moe
