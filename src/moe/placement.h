// Which rank holds which routed expert: logical experts -> physical slots -> ranks.
//
// A logical expert e (the router's output, 0..E-1) has one or more physical slots
// (replicas, for expert-parallel load balancing). Slots are numbered so that every EP
// rank holds a contiguous range of them: EP rank r holds slots [begin(r), end(r)), and
// slot p computes logical expert logical(p). Under MoE-TP every rank of the EP rank's
// MoE-TP group holds a slice of the intermediate dimension of those slots, so the
// ranks serving slot p are [owner(p)*tp, owner(p)*tp + tp).
//
// The strategies of moe/dispatch/ only ever see slot ids: MoeLayer::route maps each
// (token, k) choice to one replica of its expert (pick()), so dispatch, the
// alltoall-ll buffers (sized from max_local(), i.e. counting replicas) and the local
// expert index all work on slots. A replica holds the same weights and runs the same
// batch-invariant kernel, so which replica a slot picks never changes the output bits.
//
// contiguous(): slot p = expert p, EP rank r holds [r*E/ep, (r+1)*E/ep) (integer
// division, so E need not divide by ep: block sizes then differ by at most one).
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
  // rank_experts[r]: the logical experts EP rank r holds, one slot each, in slot order.
  // Every expert in [0, n_experts) needs at least one slot; a rank may not hold two
  // replicas of one expert (they would only split its rows on one rank), and every
  // rank needs at least one slot. Errors name the rank and the expert.
  static Placement from_ranks(int64_t n_experts, int tp, const std::vector<std::vector<int32_t>>& rank_experts);

  int64_t n_experts() const { return n_experts_; }  // logical experts E
  int64_t n_slots() const { return static_cast<int64_t>(slot_expert_.size()); }  // physical slots P >= E
  int ep() const { return ep_; }
  int tp() const { return tp_; }
  bool replicated() const { return n_slots() > n_experts_; }
  // true when slot p is expert p (contiguous() with any ep).
  bool identity() const { return identity_; }

  int owner(int64_t slot) const { return owner_[slot]; }  // EP rank
  int64_t local_index(int64_t slot) const { return slot - begin_[owner_[slot]]; }
  int64_t begin(int ep_rank) const { return begin_[ep_rank]; }  // first slot
  int64_t end(int ep_rank) const { return begin_[ep_rank + 1]; }  // one past the last
  int64_t n_local(int ep_rank) const { return end(ep_rank) - begin(ep_rank); }
  int64_t max_local() const;
  // World ranks serving slot p: tp of them from first_rank(p).
  int first_rank(int64_t slot) const { return owner_[slot] * tp_; }

  int32_t logical(int64_t slot) const { return slot_expert_[slot]; }
  const std::vector<int32_t>& slot_experts() const { return slot_expert_; }  // [P]
  // The slots of expert e, ascending; n_replicas(e) >= 1.
  const int32_t* replicas(int64_t e) const { return rep_slots_.data() + rep_begin_[e]; }
  int n_replicas(int64_t e) const { return static_cast<int>(rep_begin_[e + 1] - rep_begin_[e]); }
  // The logical experts EP rank r holds, in slot order.
  std::vector<int32_t> rank_experts(int ep_rank) const;
  // The slot a (token, choice) of expert e goes to: replica (salt mod n_replicas(e)).
  // The salt is the token's index plus a per-rank offset (MoeLayer::route), so a
  // rank's consecutive tokens and different ranks' tokens spread over the replicas,
  // and every rank computing the same token with the same salt picks the same slot.
  int32_t pick(int64_t e, int64_t salt) const {
    const int n = n_replicas(e);
    return n == 1 ? rep_slots_[rep_begin_[e]] : rep_slots_[rep_begin_[e] + salt % n];
  }

  bool operator==(const Placement& o) const {
    return ep_ == o.ep_ && tp_ == o.tp_ && n_experts_ == o.n_experts_ && slot_expert_ == o.slot_expert_ &&
           begin_ == o.begin_;
  }
  std::string describe() const;  // "E=6 ep=2 tp=1: ep0 [0,3) ep1 [3,6)" or, replicated, the experts per rank

 private:
  void index();  // owner_, replicas from slot_expert_ and begin_

  int ep_ = 1, tp_ = 1;
  int64_t n_experts_ = 0;
  bool identity_ = true;
  std::vector<int32_t> slot_expert_;  // [P] slot -> logical expert
  std::vector<int64_t> begin_;        // [ep + 1] slot range boundaries
  std::vector<int> owner_;            // [P] slot -> EP rank
  std::vector<int64_t> rep_begin_;    // [E + 1] into rep_slots_
  std::vector<int32_t> rep_slots_;    // [P] slots grouped by expert, ascending
};

}  // namespace moe
