#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <omp.h>
#include <vector>

#include "core/check.h"

namespace moe {

namespace {
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

double counter_uniform(uint64_t seed, uint64_t request, uint64_t step) {
  const uint64_t h = mix64(mix64(mix64(seed) ^ request) ^ (step * 0x632be59bd9b4e019ull));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

namespace {

// The first id of [b, e) holding its largest sort key, and that key.
struct Best {
  float key;
  int64_t id;
};
Best first_best(const float* logits, int64_t b, int64_t e) {
  // Two passes the compiler vectorises: the largest sort key (16 running maxima: a max has
  // no rounding, so any grouping gives the same value), then the first id holding it. The
  // one-pass scan carried `best` from each compare to the next: 85 us for 32000 logits, 4 %
  // of a 16-thread decode step.
  constexpr int kLanes = 16;
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = -std::numeric_limits<float>::infinity();
  int64_t i = b;
  for (; i + kLanes <= e; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float k = sort_key(logits[i + l]);
      m[l] = k > m[l] ? k : m[l];
    }
  float best = -std::numeric_limits<float>::infinity();
  for (; i < e; ++i) best = std::max(best, sort_key(logits[i]));
  for (int l = 0; l < kLanes; ++l) best = std::max(best, m[l]);
  // -0 == +0 and NaN's key is -inf, as in logit_before: the lowest id among equals wins.
  for (int64_t j = b; j < e; ++j)
    if (sort_key(logits[j]) == best) return {best, j};
  return {best, b};
}

// From this many logits the scan goes over the threads: on one thread it was `generate
// --profile`'s "sample" stage, 0.046 ms a step for 32000 logits on the 2-vCPU Xeon and
// 0.06-0.08 on 16 threads (the lm_head's tasks leave the row in the other cores' caches);
// a team's wake-up costs microseconds (docs/PERF.md, tenth session).
constexpr int64_t kParallelLogits = int64_t{1} << 14;

}  // namespace

int32_t greedy_token(const float* logits, int64_t V) {
  const int nt = V >= kParallelLogits && !omp_in_parallel() ? omp_get_max_threads() : 1;
  if (nt <= 1) return static_cast<int32_t>(first_best(logits, 0, V).id);
  // Contiguous parts, one per thread; the earliest part holding the largest key wins, so
  // the id is the row's first best whatever the team.
  // Reused: no allocation per step. Inside the region `part` would name each thread's own
  // copy, so the threads write through `out`.
  thread_local std::vector<Best> part;
  part.assign(static_cast<size_t>(nt), Best{-std::numeric_limits<float>::infinity(), V});
  Best* out = part.data();
#pragma omp parallel num_threads(nt)
  {
    const int64_t n = omp_get_num_threads(), t = omp_get_thread_num();
    out[t] = first_best(logits, V * t / n, V * (t + 1) / n);
  }
  Best r = part[0];
  for (const Best& p : part)
    if (p.key > r.key) r = p;
  return static_cast<int32_t>(r.id);
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t request, uint64_t step) {
  MOE_CHECK(V > 0, "internal: empty logits");
  if (p.greedy()) return greedy_token(logits, V);
  MOE_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got {}", p.top_p);
  MOE_CHECK(p.top_k >= 0, "--top-k must not be negative, got {}", p.top_k);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // Highest logit first; ties to the lower id (a total order, so only the first `keep`
  // need sorting and any sort gives the same ones).
  int64_t keep = (p.top_k > 0) ? std::min<int64_t>(p.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int32_t a, int32_t b) { return logit_before(logits, a, b); });
  const double mx = logits[order[0]];
  std::vector<double> w(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    w[i] = std::exp((static_cast<double>(logits[order[i]]) - mx) / p.temperature);
    total += w[i];
  }
  if (p.top_p < 1.0) {  // smallest prefix whose probability reaches top_p (at least one token)
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += w[n++];
      if (cum >= p.top_p * total) break;
    }
    keep = n;
    total = cum;
  }
  const double u = counter_uniform(p.seed, request, step) * total;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace moe
