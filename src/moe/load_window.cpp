#include "moe/load_window.h"

#include <algorithm>

#include "core/check.h"

namespace moe {

LoadWindow::LoadWindow(int64_t window, std::vector<std::vector<int64_t>> shape_like) : window_(window) {
  MOE_CHECK(window >= 1, "the expert load window must be at least 1 step, got {}", window);
  // ceil(window / kBuckets) steps per bucket, and as many buckets as fit the window, so
  // that the buckets never hold more than `window` steps.
  bucket_steps_ = (window + kBuckets - 1) / kBuckets;
  bucket_n_.assign(static_cast<size_t>((window + bucket_steps_ - 1) / bucket_steps_), 0);
  clear(shape_like);
}

void LoadWindow::clear(const std::vector<std::vector<int64_t>>& cumulative) {
  last_ = cumulative;
  sum_ = cumulative;
  for (auto& r : sum_) std::fill(r.begin(), r.end(), 0);
  bucket_.assign(bucket_n_.size(), sum_);
  std::fill(bucket_n_.begin(), bucket_n_.end(), 0);
  cur_ = steps_ = 0;
}

void LoadWindow::push(const std::vector<std::vector<int64_t>>& cumulative) {
  MOE_CHECK(cumulative.size() == last_.size(), "expert load: {} layers, the window was made for {}",
            cumulative.size(), last_.size());
  if (bucket_n_[cur_] == bucket_steps_) {  // the current bucket is full: the oldest one leaves
    cur_ = (cur_ + 1) % static_cast<int64_t>(bucket_n_.size());
    auto& old = bucket_[cur_];
    for (size_t l = 0; l < old.size(); ++l)
      for (size_t e = 0; e < old[l].size(); ++e) {
        sum_[l][e] -= old[l][e];
        old[l][e] = 0;
      }
    steps_ -= bucket_n_[cur_];
    bucket_n_[cur_] = 0;
  }
  auto& b = bucket_[cur_];
  for (size_t l = 0; l < cumulative.size(); ++l) {
    MOE_DCHECK(cumulative[l].size() == last_[l].size());
    for (size_t e = 0; e < cumulative[l].size(); ++e) {
      const int64_t d = cumulative[l][e] - last_[l][e];
      b[l][e] += d;
      sum_[l][e] += d;
      last_[l][e] = cumulative[l][e];
    }
  }
  ++bucket_n_[cur_];
  ++steps_;
}

}  // namespace moe
