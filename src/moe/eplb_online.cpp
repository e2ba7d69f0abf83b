#include "moe/eplb_online.h"

#include <fmt/format.h>

#include "core/check.h"

namespace moe {

OnlineEplb::OnlineEplb(const EplbOptions& opt, const EplbParams& params, Communicator& world,
                       std::vector<EpMoeLayer*> layers, const std::vector<std::vector<int64_t>>& counters)
    : opt_(opt),
      params_(params),
      world_(world),
      layers_(std::move(layers)),
      window_(opt.window > 0 ? opt.window : opt.interval, counters) {
  MOE_CHECK(opt_.interval >= 1, "--eplb-interval must be at least 1 step");
  for (EpMoeLayer* l : layers_)
    if (l) MOE_CHECK(l->placement().ep() == params_.ep, "EPLB: a layer's placement has ep {}, expected {}",
                     l->placement().ep(), params_.ep);
}

void OnlineEplb::after_step(const std::vector<std::vector<int64_t>>& cumulative) {
  window_.push(cumulative);
  ++step_;
  if (pending_) finish();
  if (step_ % opt_.interval == 0) begin();
}

void OnlineEplb::begin() {
  // The window's load of every MoE layer, summed over ranks (exact in f32 below 2^24
  // rows per expert and window, so every rank gets the same numbers and placements).
  const auto& sum = window_.sum();
  std::vector<float> flat;
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l]) flat.insert(flat.end(), sum[l].begin(), sum[l].end());
  world_.all_reduce_sum(flat.data(), flat.size());
  size_t off = 0;
  double before = 0, after = 0;
  int64_t n_layers = 0, moved = 0;
  for (EpMoeLayer* L : layers_) {
    if (!L) continue;
    const Placement& cur = L->placement();
    const int64_t E = cur.n_experts();
    std::vector<double> load(flat.begin() + off, flat.begin() + off + E);
    off += E;
    auto ranks = eplb_place(load, params_);
    std::vector<std::vector<int32_t>> now(cur.ep());
    for (int r = 0; r < cur.ep(); ++r) now[r] = cur.rank_experts(r);
    eplb_keep_in_place(ranks, now, params_.nodes);
    Placement next = Placement::from_ranks(E, cur.tp(), ranks);
    const double b = placement_imbalance(cur, load), a = placement_imbalance(next, load);
    ++n_layers;
    before += b;
    // A layer moves only for a real gain: a new placement within kMinGain of the
    // current one's imbalance is noise of the window, not worth its weights' traffic.
    constexpr double kMinGain = 0.02;
    if (next == cur || a > b * (1.0 - kMinGain)) {
      after += b;
      continue;
    }
    after += a;
    moved += slots_moved(cur, next);
    L->begin_rebalance(std::move(next));
  }
  report_.imbalance_before = n_layers ? before / n_layers : 1.0;
  report_.imbalance_after = n_layers ? after / n_layers : 1.0;
  report_.slots_moved += moved;
  report_.last_step = step_;
  ++report_.rebalances;
  // Every rank made the same decisions, so every rank agrees on whether to finish.
  pending_ = moved > 0;
}

void OnlineEplb::finish() {
  double stall = 0, sent = 0;
  int64_t received = 0;
  for (EpMoeLayer* L : layers_) {
    if (!L || !L->rebalance_pending()) continue;
    const RebalanceStats s = L->finish_rebalance();
    stall += s.begin_s + s.finish_s;
    sent += s.bytes_sent;
    received += s.slots_received;
  }
  pending_ = false;
  // Bytes over all ranks: one small all-reduce, once per rebalance.
  float tot[2] = {static_cast<float>(sent), static_cast<float>(received)};
  world_.all_reduce_sum(tot, 2);
  report_.bytes_moved += tot[0];
  report_.stall_s += stall;
  report_.max_stall_s = std::max(report_.max_stall_s, stall);
  if (opt_.log && world_.rank() == 0)
    opt_.log(fmt::format("eplb: step {}: {} expert slots moved ({:.1f} MB over all ranks), imbalance (max/mean rows "
                         "per rank, mean over layers) {:.3f} -> {:.3f}, rank 0's step loop stalled {:.1f} ms",
                         report_.last_step, static_cast<int64_t>(tot[1]), tot[0] / 1e6, report_.imbalance_before,
                         report_.imbalance_after, stall * 1e3));
}

}  // namespace moe
