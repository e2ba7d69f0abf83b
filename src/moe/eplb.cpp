#include "moe/eplb.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace moe {
namespace {

// Items (weights w) into n_packs packs of exactly w.size() / n_packs items: heaviest
// first onto the least loaded pack that has room and that `ok(item, pack)` allows.
// Returns the pack of each item. When no allowed pack has room, a swap with an item
// of an allowed (full) pack makes one; failing that it throws.
template <class Ok>
std::vector<int> balanced_packing(const std::vector<double>& w, int n_packs, Ok&& ok, std::vector<int>* members_out) {
  const int n = static_cast<int>(w.size());
  const int cap = n / n_packs;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  std::vector<int> pack(n, -1), count(n_packs, 0);
  std::vector<double> load(n_packs, 0.0);
  std::vector<std::vector<int>> members(n_packs);
  for (const int i : order) {
    int best = -1;
    for (int q = 0; q < n_packs; ++q)
      if (count[q] < cap && ok(i, pack, q) && (best < 0 || load[q] < load[best])) best = q;
    if (best < 0) {
      // Dead end: every pack with room refuses i. Move some item j of a full pack r
      // that accepts i into a pack q with room that accepts j.
      for (int q = 0; q < n_packs && best < 0; ++q) {
        if (count[q] >= cap) continue;
        for (int r = 0; r < n_packs && best < 0; ++r) {
          if (r == q || !ok(i, pack, r)) continue;
          for (int& j : members[r]) {
            pack[j] = -1;
            const bool fits = ok(j, pack, q);
            pack[j] = r;
            if (!fits) continue;
            pack[j] = q;
            members[q].push_back(j);
            ++count[q];
            load[q] += w[j];
            load[r] -= w[j];
            --count[r];
            j = members[r].back();
            members[r].pop_back();
            best = r;
            break;
          }
        }
      }
      MOE_CHECK(best >= 0, "EPLB: no rank can take another replica without holding two of one expert");
    }
    pack[i] = best;
    members[best].push_back(i);
    ++count[best];
    load[best] += w[i];
  }
  // Refinement: swap an item of the most loaded pack with a lighter one of another pack
  // while that lowers the most loaded pack (greedy alone leaves uneven counts of
  // near-equal items, e.g. 1000-row experts beside 500-row replica halves).
  for (int iter = 0; iter < 4 * n; ++iter) {
    const int mx = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    double best_peak = load[mx];
    int bq = -1, ba = -1, bb = -1;
    for (int q = 0; q < n_packs; ++q) {
      if (q == mx) continue;
      for (size_t ia = 0; ia < members[mx].size(); ++ia)
        for (size_t ib = 0; ib < members[q].size(); ++ib) {
          const int a = members[mx][ia], b = members[q][ib];
          const double d = w[a] - w[b];
          if (d <= 0) continue;
          const double peak = std::max(load[mx] - d, load[q] + d);
          if (peak >= best_peak) continue;
          pack[a] = pack[b] = -1;
          const bool fits = ok(a, pack, q) && ok(b, pack, mx);
          pack[a] = mx;
          pack[b] = q;
          if (fits) best_peak = peak, bq = q, ba = static_cast<int>(ia), bb = static_cast<int>(ib);
        }
    }
    if (bq < 0) break;
    int& a = members[mx][ba];
    int& b = members[bq][bb];
    const double d = w[a] - w[b];
    pack[a] = bq;
    pack[b] = mx;
    std::swap(a, b);
    load[mx] -= d;
    load[bq] += d;
  }
  if (members_out) {
    members_out->clear();
    for (const auto& m : members) members_out->insert(members_out->end(), m.begin(), m.end());
  }
  return pack;
}

}  // namespace

std::vector<std::vector<int32_t>> eplb_place(const std::vector<double>& load, const EplbParams& p) {
  const int64_t E = static_cast<int64_t>(load.size());
  const int64_t P = E + p.redundant;
  MOE_CHECK(E >= 1 && p.ep >= 1 && p.redundant >= 0, "EPLB: needs experts, ep >= 1 and R >= 0 (E={}, ep={}, R={})", E,
            p.ep, p.redundant);
  for (int64_t e = 0; e < E; ++e)
    MOE_CHECK(std::isfinite(load[e]) && load[e] >= 0, "EPLB: the load of expert {} is {} (expected >= 0)", e, load[e]);
  MOE_CHECK(P % p.ep == 0,
            "--redundant-experts {}: the {} experts + {} redundant = {} slots do not divide over {} EP ranks (every "
            "rank holds the same number of slots; e.g. R = {})",
            p.redundant, E, p.redundant, P, p.ep, (p.ep - E % p.ep) % p.ep);
  MOE_CHECK(p.nodes >= 1 && p.ep % p.nodes == 0, "EPLB: --nodes {} must divide the {} EP ranks", p.nodes, p.ep);
  const int rpn = p.ep / p.nodes;  // ranks per node
  MOE_CHECK(P / p.ep <= E, "EPLB: {} slots per rank exceed the {} experts (a rank holds each expert at most once)",
            P / p.ep, E);
  const bool hier = p.groups > 1 && p.groups % p.nodes == 0 && E % p.groups == 0;
  const int G = hier ? p.groups : 1, N = hier ? p.nodes : 1;
  const int ranks_per_pack = p.ep / N;
  const int64_t gsize = E / G, e_per_node = E / N, phy_per_node = P / N;
  MOE_CHECK(phy_per_node - e_per_node <= e_per_node * (ranks_per_pack - 1),
            "--redundant-experts {} is more than {} EP ranks can hold without two replicas of one expert on a rank "
            "(at most {} per node)",
            p.redundant, p.ep, e_per_node * (ranks_per_pack - 1));
  (void)rpn;

  // 1. Groups onto nodes (hierarchical), else everything is one node.
  std::vector<int64_t> node_experts;  // experts in node order: node n holds [n*E/N, (n+1)*E/N)
  {
    std::vector<double> gload(G, 0.0);
    for (int64_t e = 0; e < E; ++e) gload[e / gsize] += load[e];
    std::vector<int> order;
    balanced_packing(gload, N, [](int, const std::vector<int>&, int) { return true; }, &order);
    for (const int g : order)
      for (int64_t i = 0; i < gsize; ++i) node_experts.push_back(g * gsize + i);
  }

  std::vector<std::vector<int32_t>> ranks(p.ep);
  for (int n = 0; n < N; ++n) {
    // 2. Replicas inside the node: one at a time to the largest load per replica.
    const int64_t* ex = node_experts.data() + n * e_per_node;
    std::vector<int> cnt(e_per_node, 1);
    std::vector<int64_t> phy(e_per_node);  // slot -> index into ex
    std::iota(phy.begin(), phy.end(), 0);
    for (int64_t s = e_per_node; s < phy_per_node; ++s) {
      int64_t best = -1;
      for (int64_t i = 0; i < e_per_node; ++i)
        if (cnt[i] < ranks_per_pack && (best < 0 || load[ex[i]] * cnt[best] > load[ex[best]] * cnt[i])) best = i;
      phy.push_back(best);
      ++cnt[best];
    }
    // 3. Slots onto the node's ranks, never two of one expert on a rank.
    std::vector<double> w(phy_per_node);
    for (int64_t s = 0; s < phy_per_node; ++s) w[s] = load[ex[phy[s]]] / cnt[phy[s]];
    const auto ok = [&](int s, const std::vector<int>& pack, int q) {
      for (int64_t t = 0; t < phy_per_node; ++t)
        if (t != s && pack[t] == q && phy[t] == phy[s]) return false;
      return true;
    };
    const std::vector<int> pack = balanced_packing(w, ranks_per_pack, ok, nullptr);
    for (int64_t s = 0; s < phy_per_node; ++s)
      ranks[n * ranks_per_pack + pack[s]].push_back(static_cast<int32_t>(ex[phy[s]]));
  }
  for (auto& r : ranks) std::sort(r.begin(), r.end());
  // Never worse than the blocks it replaces: without redundant slots, the contiguous
  // placement (which keeps contiguous groups on their node too) when it is better.
  if (p.redundant == 0 && E % p.ep == 0) {
    const Placement blocks = Placement::contiguous(E, p.ep, 1);
    if (placement_imbalance(blocks, load) < placement_imbalance(Placement::from_ranks(E, 1, ranks), load))
      for (int r = 0; r < p.ep; ++r) ranks[r] = blocks.rank_experts(r);
  }
  return ranks;
}

int64_t eplb_keep_in_place(std::vector<std::vector<int32_t>>& next, const std::vector<std::vector<int32_t>>& cur,
                           int nodes) {
  const int ep = static_cast<int>(next.size());
  MOE_CHECK(static_cast<int>(cur.size()) == ep && nodes >= 1 && ep % nodes == 0,
            "EPLB: the current placement has {} ranks, the new one {} (nodes {})", cur.size(), ep, nodes);
  const auto overlap = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    int64_t n = 0;
    for (const int32_t e : a) n += std::count(b.begin(), b.end(), e);
    return n;
  };
  const int rpn = ep / nodes;
  std::vector<std::vector<int32_t>> out(ep);
  for (int n = 0; n < nodes; ++n) {
    // Greedy: the (new, old) pair with the most experts in common first, then swaps of
    // two assignments while one raises the total.
    const int b = n * rpn;
    std::vector<std::vector<int64_t>> ov(rpn, std::vector<int64_t>(rpn));
    for (int i = 0; i < rpn; ++i)
      for (int j = 0; j < rpn; ++j) ov[i][j] = overlap(next[b + i], cur[b + j]);
    std::vector<int> to(rpn, -1);
    std::vector<char> used(rpn, 0);
    for (int step = 0; step < rpn; ++step) {
      int bi = -1, bj = -1;
      for (int i = 0; i < rpn; ++i)
        for (int j = 0; j < rpn; ++j)
          if (to[i] < 0 && !used[j] && (bi < 0 || ov[i][j] > ov[bi][bj])) bi = i, bj = j;
      to[bi] = bj;
      used[bj] = 1;
    }
    for (bool improved = true; improved;) {
      improved = false;
      for (int i = 0; i < rpn; ++i)
        for (int k = i + 1; k < rpn; ++k)
          if (ov[i][to[k]] + ov[k][to[i]] > ov[i][to[i]] + ov[k][to[k]]) {
            std::swap(to[i], to[k]);
            improved = true;
          }
    }
    for (int i = 0; i < rpn; ++i) out[b + to[i]] = next[b + i];
  }
  next = std::move(out);
  int64_t moved = 0;
  for (int r = 0; r < ep; ++r) moved += static_cast<int64_t>(next[r].size()) - overlap(next[r], cur[r]);
  return moved;
}

double placement_imbalance(const Placement& p, const std::vector<double>& load) {
  MOE_CHECK(static_cast<int64_t>(load.size()) == p.n_experts(), "load has {} experts, the placement {}", load.size(),
            p.n_experts());
  std::vector<double> rank(p.ep(), 0.0);
  for (int64_t s = 0; s < p.n_slots(); ++s) {
    const int32_t e = p.logical(s);
    rank[p.owner(s)] += load[e] / p.n_replicas(e);
  }
  const double sum = std::accumulate(rank.begin(), rank.end(), 0.0);
  if (sum <= 0) return 1.0;
  return *std::max_element(rank.begin(), rank.end()) / (sum / p.ep());
}

int64_t slots_moved(const Placement& from, const Placement& to) {
  MOE_CHECK(from.ep() == to.ep() && from.n_experts() == to.n_experts(), "slots_moved: placements of other layouts");
  int64_t n = 0;
  for (int r = 0; r < to.ep(); ++r) {
    const auto had = from.rank_experts(r);
    for (const int32_t e : to.rank_experts(r)) n += std::find(had.begin(), had.end(), e) == had.end();
  }
  return n;
}

}  // namespace moe
