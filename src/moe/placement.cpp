#include "moe/placement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  p.n_experts_ = n_experts;
  p.slot_expert_.resize(n_experts);
  for (int64_t e = 0; e < n_experts; ++e) p.slot_expert_[e] = static_cast<int32_t>(e);
  p.begin_.resize(ep + 1);
  for (int r = 0; r <= ep; ++r) p.begin_[r] = static_cast<int64_t>(r) * n_experts / ep;
  p.index();
  return p;
}

Placement Placement::from_ranks(int64_t n_experts, int tp, const std::vector<std::vector<int32_t>>& rank_experts) {
  const int ep = static_cast<int>(rank_experts.size());
  MOE_CHECK(ep >= 1 && tp >= 1, "a placement needs at least one EP rank and tp >= 1 (got {} ranks, tp={})", ep, tp);
  MOE_CHECK(n_experts >= 1, "a placement needs at least one expert");
  Placement p;
  p.ep_ = ep;
  p.tp_ = tp;
  p.n_experts_ = n_experts;
  p.begin_.assign(1, 0);
  for (int r = 0; r < ep; ++r) {
    const auto& list = rank_experts[r];
    MOE_CHECK(!list.empty(), "placement: EP rank {} holds no expert slot (every rank needs at least one)", r);
    std::vector<int32_t> sorted(list);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      MOE_CHECK(sorted[i] >= 0 && sorted[i] < n_experts, "placement: EP rank {} names expert {}, outside [0, {})", r,
                sorted[i], n_experts);
      MOE_CHECK(i == 0 || sorted[i] != sorted[i - 1],
                "placement: EP rank {} holds two replicas of expert {} (replicas on one rank only split its rows "
                "there; put them on different ranks)",
                r, sorted[i]);
    }
    p.slot_expert_.insert(p.slot_expert_.end(), list.begin(), list.end());
    p.begin_.push_back(static_cast<int64_t>(p.slot_expert_.size()));
  }
  std::vector<char> seen(n_experts, 0);
  for (const int32_t e : p.slot_expert_) seen[e] = 1;
  for (int64_t e = 0; e < n_experts; ++e)
    MOE_CHECK(seen[e], "placement: expert {} has no slot on any of the {} EP ranks (every expert needs one)", e, ep);
  p.index();
  return p;
}

void Placement::index() {
  const int64_t P = n_slots(), E = n_experts_;
  owner_.resize(P);
  for (int r = 0; r < ep_; ++r)
    for (int64_t s = begin_[r]; s < begin_[r + 1]; ++s) owner_[s] = r;
  rep_begin_.assign(E + 1, 0);
  for (const int32_t e : slot_expert_) ++rep_begin_[e + 1];
  for (int64_t e = 0; e < E; ++e) rep_begin_[e + 1] += rep_begin_[e];
  rep_slots_.resize(P);
  std::vector<int64_t> cur(rep_begin_.begin(), rep_begin_.end() - 1);
  for (int64_t s = 0; s < P; ++s) rep_slots_[cur[slot_expert_[s]]++] = static_cast<int32_t>(s);
  identity_ = P == E;
  for (int64_t s = 0; s < P && identity_; ++s) identity_ = slot_expert_[s] == s;
}

int64_t Placement::max_local() const {
  int64_t m = 0;
  for (int r = 0; r < ep_; ++r) m = std::max(m, n_local(r));
  return m;
}

std::vector<int32_t> Placement::rank_experts(int ep_rank) const {
  return {slot_expert_.begin() + begin(ep_rank), slot_expert_.begin() + end(ep_rank)};
}

std::string Placement::describe() const {
  std::string s = fmt::format("E={} ep={} tp={}:", n_experts(), ep_, tp_);
  if (identity_) {
    for (int r = 0; r < ep_; ++r) s += fmt::format(" ep{} [{},{})", r, begin(r), end(r));
    return s;
  }
  s += fmt::format(" {} slots;", n_slots());
  for (int r = 0; r < ep_; ++r) s += fmt::format(" ep{} {{{}}}", r, fmt::join(rank_experts(r), ","));
  return s;
}

}  // namespace moe
