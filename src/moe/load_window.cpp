#include "moe/load_window.h"

#include <algorithm>

#include "core/check.h"

namespace moe {

LoadWindow::LoadWindow(int64_t window, std::vector<std::vector<int64_t>> shape_like) : window_(window) {
  MOE_CHECK(window >= 1, "the expert load window must be at least 1 step, got {}", window);
  clear(shape_like);
}

void LoadWindow::clear(const std::vector<std::vector<int64_t>>& cumulative) {
  last_ = cumulative;
  sum_ = cumulative;
  for (auto& r : sum_) std::fill(r.begin(), r.end(), 0);
  ring_.assign(static_cast<size_t>(window_), sum_);
  pushed_ = 0;
}

void LoadWindow::push(const std::vector<std::vector<int64_t>>& cumulative) {
  MOE_CHECK(cumulative.size() == last_.size(), "expert load: {} layers, the window was made for {}",
            cumulative.size(), last_.size());
  auto& slot = ring_[static_cast<size_t>(pushed_ % window_)];
  for (size_t l = 0; l < cumulative.size(); ++l) {
    MOE_DCHECK(cumulative[l].size() == last_[l].size());
    for (size_t e = 0; e < cumulative[l].size(); ++e) {
      const int64_t d = cumulative[l][e] - last_[l][e];
      sum_[l][e] += d - slot[l][e];
      slot[l][e] = d;
      last_[l][e] = cumulative[l][e];
    }
  }
  ++pushed_;
}

}  // namespace moe
