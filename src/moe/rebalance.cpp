// EpMoeLayer's online rebalancing (moe/ep_layer.h): moving expert slots between ranks
// while the steps go on.
#include <cstring>

#include "core/check.h"
#include "moe/dispatch/common.h"
#include "moe/ep_layer.h"
#include "moe/rebalance.h"

namespace moe {

namespace {

// Tag of the rebalance messages; point-to-point never matches a collective, and only
// this code sends point-to-point on the world communicator.
constexpr int kRebalanceTag = 0x4550;

// The slot of expert e on EP rank r under p, or -1.
int64_t slot_on(const Placement& p, int64_t e, int r) {
  const int32_t* s = p.replicas(e);
  for (int i = 0; i < p.n_replicas(e); ++i)
    if (p.owner(s[i]) == r) return s[i];
  return -1;
}

// Both packed tensors of a slot, piece by piece (kernels/grouped_gemm.h expert_pieces).
std::vector<BytePiece> slot_pieces(const MoeLayerWeights& w, int64_t local) {
  std::vector<BytePiece> p = expert_pieces(w.w13, local);
  for (const BytePiece& q : expert_pieces(w.w2, local)) p.push_back(q);
  return p;
}

}  // namespace


bool EpMoeLayer::rebalance_pending() const { return pending_ != nullptr; }

void EpMoeLayer::begin_rebalance(Placement next) {
  MOE_CHECK(!pending_, "begin_rebalance: the previous rebalance was not finished");
  const Placement& cur = placement_;
  MOE_CHECK(next.ep() == cur.ep() && next.tp() == cur.tp() && next.n_experts() == cur.n_experts(),
            "rebalance: the new placement ({}) is for another layout than the current one ({})", next.describe(),
            cur.describe());
  const double t0 = now_s();
  const int tp = cur.tp(), me = world_.rank(), my_ep = me / tp, tp_rank = me % tp;
  const MoeLayerWeights& old = layer_.weights();
  auto p = std::make_unique<Pending>();
  p->next = std::move(next);
  const Placement& nx = p->next;

  // Everything but the routed slots is shared with the current weights (tensors share
  // storage); the slots are new buffers, so the current ones keep serving until the switch.
  MoeLayerWeights& w = p->w;
  w = old;
  w.expert_begin = nx.begin(my_ep);
  w.expert_end = nx.end(my_ep);
  w.slot_expert = nx.identity() ? std::vector<int32_t>{} : nx.slot_experts();
  w.w13 = make_packed_like(old.w13, nx.n_local(my_ep));
  w.w2 = make_packed_like(old.w2, nx.n_local(my_ep));

  // The plan, computed alike on every rank: new slots in (EP rank, slot) order, each
  // from this EP rank's own old slot of the expert or from one replica's holder. The
  // pieces travel straight between the packed storages (no staging copies), and the
  // receiving slots are new buffers, so nothing in use is written.
  std::vector<Communicator::Message> sends, recvs;
  for (int d = 0; d < nx.ep(); ++d)
    for (int64_t s = nx.begin(d); s < nx.end(d); ++s) {
      const int32_t e = nx.logical(s);
      const int64_t own = slot_on(cur, e, d);
      const int src = own >= 0 ? d : cur.owner(cur.replicas(e)[d % cur.n_replicas(e)]);
      if (d == my_ep && own >= 0) {  // held already: a local copy
        copy_expert(w.w13, s - nx.begin(d), old.w13, cur.local_index(own));
        copy_expert(w.w2, s - nx.begin(d), old.w2, cur.local_index(own));
        ++p->stats.slots_copied;
      } else if (d == my_ep) {
        for (const BytePiece& q : slot_pieces(w, s - nx.begin(d))) {
          recvs.push_back({src * tp + tp_rank, q.data, q.bytes});
          p->stats.bytes_received += static_cast<double>(q.bytes);
        }
        ++p->stats.slots_received;
      } else if (src == my_ep && own < 0) {
        for (const BytePiece& q : slot_pieces(old, cur.local_index(slot_on(cur, e, my_ep)))) {
          sends.push_back({d * tp + tp_rank, q.data, q.bytes});
          p->stats.bytes_sent += static_cast<double>(q.bytes);
        }
      }
    }
  p->req = world_.isend_recv(sends, recvs, kRebalanceTag);
  p->stats.begin_s = now_s() - t0;
  pending_ = std::move(p);
}

RebalanceStats EpMoeLayer::finish_rebalance() {
  MOE_CHECK(pending_, "finish_rebalance: no rebalance was begun");
  const double t0 = now_s();
  Pending& p = *pending_;
  p.req->wait();
  layer_ = MoeLayer(layer_.config(), std::move(p.w));
  placement_ = std::move(p.next);
  attach_placement();
  for (auto& s : strategies_) s.reset();  // alltoall-ll sizes its buffers from the placement
  slot_gather_.reset();
  RebalanceStats st = p.stats;
  pending_.reset();
  st.finish_s = now_s() - t0;
  return st;
}

}  // namespace moe
