// Expert load over a sliding window of steps: per MoE layer and expert, the (token, k)
// choices routed to it in the last `window` steps. Fed once per step with the
// cumulative counts the layers keep anyway (Model::expert_load), so its cost is one
// pass over layers x experts integers per step.
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

class LoadWindow {
 public:
  // layers x experts counters; window >= 1 steps.
  LoadWindow(int64_t window, std::vector<std::vector<int64_t>> shape_like);
  LoadWindow() = default;

  // One step ended; `cumulative` are the counters as they stand now (same shape).
  void push(const std::vector<std::vector<int64_t>>& cumulative);
  // The rows of the last steps() steps (at most window()), [layers][E].
  const std::vector<std::vector<int64_t>>& sum() const { return sum_; }
  int64_t window() const { return window_; }
  int64_t steps() const { return std::min<int64_t>(pushed_, window_); }
  int64_t pushed() const { return pushed_; }
  // Forgets every step (e.g. after the counters were reset).
  void clear(const std::vector<std::vector<int64_t>>& cumulative);

 private:
  int64_t window_ = 1, pushed_ = 0;
  std::vector<std::vector<int64_t>> last_, sum_;
  std::vector<std::vector<std::vector<int64_t>>> ring_;  // [window][layers][E] per-step deltas
};

}  // namespace moe
