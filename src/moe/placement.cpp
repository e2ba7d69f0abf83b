#include "moe/placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"

namespace moe {

Placement Placement::contiguous(int64_t n_experts, int ep, int tp) {
  MOE_CHECK(ep >= 1 && tp >= 1, "--ep and --tp must be at least 1 (got ep={}, tp={})", ep, tp);
  MOE_CHECK(n_experts >= ep, "--ep {} exceeds the {} routed experts: every EP rank needs at least one expert", ep,
            n_experts);
  Placement p;
  p.ep_ = ep;
  p.tp_ = tp;
  p.owner_.resize(n_experts);
  p.begin_.resize(ep + 1);
  for (int r = 0; r <= ep; ++r) p.begin_[r] = static_cast<int64_t>(r) * n_experts / ep;
  for (int r = 0; r < ep; ++r)
    for (int64_t e = p.begin_[r]; e < p.begin_[r + 1]; ++e) p.owner_[e] = r;
  return p;
}

int64_t Placement::max_local() const {
  int64_t m = 0;
  for (int r = 0; r < ep_; ++r) m = std::max(m, n_local(r));
  return m;
}

std::string Placement::describe() const {
  std::string s = fmt::format("E={} ep={} tp={}:", n_experts(), ep_, tp_);
  for (int r = 0; r < ep_; ++r) s += fmt::format(" ep{} [{},{})", r, begin(r), end(r));
  return s;
}

}  // namespace moe
