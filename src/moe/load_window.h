// Expert load over a sliding window of steps: per MoE layer and expert, the (token, k)
// choices routed to it in about the last `window` steps. Fed once per step with the
// cumulative counts the layers keep anyway (Model::expert_load), so its cost is one
// pass over layers x experts integers per step. The window is kept in
// at most kBuckets buckets of ceil(window / kBuckets) steps, so its memory is bounded
// (58 layers x 256 experts x 32 buckets x 8 B = 3.8 MB for any window; one array per
// step would take 119 MB for a window of 1000 steps); the sum then covers between
// window - bucket + 1 and window steps, and steps() says how many.
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

class LoadWindow {
 public:
  static constexpr int64_t kBuckets = 32;
  // layers x experts counters; window >= 1 steps.
  LoadWindow(int64_t window, std::vector<std::vector<int64_t>> shape_like);
  LoadWindow() = default;

  // One step ended; `cumulative` are the counters as they stand now (same shape).
  void push(const std::vector<std::vector<int64_t>>& cumulative);
  // The rows of the last steps() steps, [layers][E].
  const std::vector<std::vector<int64_t>>& sum() const { return sum_; }
  int64_t window() const { return window_; }
  int64_t steps() const { return steps_; }
  // Forgets every step (e.g. after the counters were reset).
  void clear(const std::vector<std::vector<int64_t>>& cumulative);

 private:
  int64_t window_ = 1, bucket_steps_ = 1, cur_ = 0, steps_ = 0;
  std::vector<std::vector<int64_t>> last_, sum_;
  std::vector<std::vector<std::vector<int64_t>>> bucket_;  // [buckets][layers][E]
  std::vector<int64_t> bucket_n_;                          // steps in each bucket
};

}  // namespace moe
