// Which rank holds which routed expert.
//
// A logical expert e lives on one EP rank (its "owner"); under MoE-TP every rank of
// that EP rank's MoE-TP group holds a slice of its intermediate dimension, so the
// ranks serving e are [owner*tp, owner*tp + tp). By default EP rank r owns the
// contiguous block [r*E/ep, (r+1)*E/ep) (integer division), so E need not divide
// by ep: block sizes then differ by at most one. The owner table is the hook for
// other placements (redundant experts, load balancing) later.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

class Placement {
 public:
  Placement() = default;
  // Contiguous blocks over `ep` EP ranks, each EP rank served by `tp` consecutive ranks.
  static Placement contiguous(int64_t n_experts, int ep, int tp);

  int64_t n_experts() const { return static_cast<int64_t>(owner_.size()); }
  int ep() const { return ep_; }
  int tp() const { return tp_; }
  int owner(int64_t expert) const { return owner_[expert]; }          // EP rank
  int64_t local_index(int64_t expert) const { return expert - begin_[owner_[expert]]; }
  int64_t begin(int ep_rank) const { return begin_[ep_rank]; }        // first expert
  int64_t end(int ep_rank) const { return begin_[ep_rank + 1]; }      // one past the last
  int64_t n_local(int ep_rank) const { return end(ep_rank) - begin(ep_rank); }
  int64_t max_local() const;
  // World ranks serving expert e (tp of them).
  int first_rank(int64_t expert) const { return owner_[expert] * tp_; }

  std::string describe() const;  // "ep=2 tp=1: rank0 [0,3) rank1 [3,6)"

 private:
  int ep_ = 1, tp_ = 1;
  std::vector<int> owner_;      // [E] expert -> EP rank
  std::vector<int64_t> begin_;  // [ep + 1] block boundaries
};

}  // namespace moe
