// `mpirun -np N moe-ep bench --ep N --eplb [--redundant-experts R] [--skew zipf:S]`:
// one MoE layer under the contiguous expert placement and under EPLB's placement of
// the load measured in the same run, side by side. Per token count: the rows each rank
// computes (imbalance = max over mean of them over a pool of calls), and ms/call (the
// slowest rank's median) for both. Before timing, the EPLB layer's output is checked
// bit for bit against the contiguous layer's for the all-to-all strategies (the
// replicas hold byte copies and the source sums in slot order), within the
// reference's tolerance otherwise.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <nlohmann/json.hpp>

#include "cli/bench_cmd.h"
#include "cli/bench_common.h"
#include "comm/groups.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/threads.h"
#include "moe/ep_layer.h"
#include "moe/eplb.h"
#include "moe/slot_weights.h"

namespace moe {

namespace {

using bench::median;

// Over n calls cycling through inputs: the slowest rank's median ms per call, and the
// ranks' median compute time (EpStats::compute_s: routing, packing, experts, combine),
// max over mean: whether the rows' balance reached the time.
struct CallTime {
  double ms = 0, compute_imbalance = 0;
};
CallTime ms_per_call(EpMoeLayer& layer, const std::vector<Tensor>& inputs, int n) {
  std::vector<double> t, c;
  for (int i = 0; i < n; ++i) {
    const double t0 = now_s();
    layer.forward(inputs[i % inputs.size()]);
    t.push_back(now_s() - t0);
    c.push_back(layer.stats().compute_s);
  }
  double m[2] = {median(t), median(c)};
  std::vector<double> all(2 * layer.comm().size());
  layer.comm().all_gather(m, sizeof m, all.data());
  double mx = 0, cmax = 0, csum = 0;
  for (size_t r = 0; r < all.size() / 2; ++r) {
    mx = std::max(mx, all[2 * r]);
    cmax = std::max(cmax, all[2 * r + 1]);
    csum += all[2 * r + 1];
  }
  return {mx * 1e3, csum > 0 ? cmax / (csum / (all.size() / 2)) : 1.0};
}

// Max over mean of the rows each EP rank's slots computed over one pass of the pool
// (MoE-TP ranks of an EP rank compute the same rows: counted once).
double rank_imbalance(EpMoeLayer& layer, const std::vector<Tensor>& inputs) {
  float rows = 0;
  for (const Tensor& x : inputs) {
    layer.forward(x);
    rows += static_cast<float>(layer.stats().rows);
  }
  Communicator& c = layer.comm();
  std::vector<float> all(c.size());
  c.all_gather(&rows, sizeof rows, all.data());
  const int tp = layer.placement().tp();
  double mx = 0, sum = 0;
  for (size_t r = 0; r < all.size(); r += tp) {
    mx = std::max<double>(mx, all[r]);
    sum += all[r];
  }
  return sum > 0 ? mx / (sum / (all.size() / tp)) : 1.0;
}

}  // namespace

int run_bench_eplb(const BenchOptions& o, Communicator& world) {
  const MoeConfig cfg = bench::bench_config(o);
  MOE_CHECK(bench::dtype_list(o.dtype).size() == 1, "bench --eplb takes one --dtype (got '{}')", o.dtype);
  MOE_CHECK(o.parallel.eplb.placement_file.empty() && o.parallel.eplb.interval == 0,
            "bench --eplb computes the EPLB placement itself: no --placement or --eplb-interval");
  int64_t int4_group = 0;
  const DType dtype = bench::bench_dtype(o.dtype, o.int4_group, &int4_group);
  const ParallelConfig& par = o.parallel.par;
  const int R = world.size(), rank = world.rank();
  MOE_CHECK(par.ep > 1 && par.dp == 1, "bench --eplb needs --ep > 1 (and --dp 1)");
  ParallelGroups groups(world, par);
  const EpOptions eo = o.parallel.ep_options();
  const bool replicated = eo.comm == MoeComm::AllReduce;
  const double skew = bench::parse_skew(o.skew);
  const bool root = rank == 0;
  const int64_t H = cfg.hidden_size, E = cfg.n_experts;

  const auto build = [&](const Placement& pl) {
    MoeLayerWeights w = load_slot_weights(pl, groups.ep_rank(), [&](int64_t b, int64_t e) {
      return bench::random_layer(cfg, dtype, b, e, groups.tp_rank(), par.tp, int4_group);
    });
    bench::skew_router(cfg, w, skew);
    return std::make_unique<EpMoeLayer>(MoeLayer(cfg, std::move(w)), world, pl, eo);
  };
  const double t_build = now_s();
  const Placement before_pl = Placement::contiguous(E, par.ep, par.tp);
  auto before = build(before_pl);

  // The load EPLB places: routed (token, k) choices per expert over a calibration pool
  // of the largest token count, summed over ranks.
  const int64_t T_cal = *std::max_element(o.tokens.begin(), o.tokens.end());
  constexpr int kPool = 8;
  const auto pool = [&](int64_t T) {
    std::vector<Tensor> v;
    for (int i = 0; i < kPool; ++i) {
      v.push_back(bench::random_tensor({T, H}, 1.f, 1000003ull * T + i + (replicated ? 0 : 7919ull * rank)));
      if (skew > 0) bench::skew_inputs(v.back());
    }
    return v;
  };
  std::vector<int64_t> counts(E, 0);
  {
    const std::vector<Tensor> cal = pool(T_cal);
    before->local().count_routed(counts.data());
    for (const Tensor& x : cal) before->forward(x);
    before->local().count_routed(nullptr);
  }
  std::vector<float> lf(counts.begin(), counts.end());
  world.all_reduce_sum(lf.data(), lf.size());
  const std::vector<double> load(lf.begin(), lf.end());
  const double mean_load = std::accumulate(load.begin(), load.end(), 0.0) / E;
  const double expert_skew = mean_load > 0 ? *std::max_element(load.begin(), load.end()) / mean_load : 1.0;
  EplbParams ep_params{par.ep, o.parallel.eplb.redundant, o.parallel.eplb.nodes,
                       static_cast<int>(std::max<int64_t>(1, cfg.routing.n_group))};
  // As an online rebalance would: ranks renumbered to keep as many experts in place.
  auto after_ranks = eplb_place(load, ep_params);
  {
    std::vector<std::vector<int32_t>> cur(par.ep);
    for (int r = 0; r < par.ep; ++r) cur[r] = before_pl.rank_experts(r);
    eplb_keep_in_place(after_ranks, cur, ep_params.nodes);
  }
  const Placement after_pl = Placement::from_ranks(E, par.tp, after_ranks);
  auto after = build(after_pl);
  world.barrier();
  if (root)
    fmt::print(
        "moe-ep bench --eplb: shape {} (H={} I={} E={} k={}), dtype {}, {} ranks ({}), moe-comm {}, {} threads per "
        "rank, skew {}\n  routed load of the calibration pool ({} calls x {} tokens per rank): busiest expert {:.2f}x "
        "the mean; layers built in {:.1f} s\n  before: {}\n  after (EPLB, {} redundant): {}\n  predicted imbalance "
        "from that load: {:.3f} -> {:.3f}\n\n",
        o.shape, H, cfg.moe_intermediate_size, E, cfg.top_k, o.dtype, R, to_string(par), o.parallel.moe_comm,
        num_threads(), o.skew.empty() ? "none" : o.skew, kPool, T_cal, expert_skew, now_s() - t_build,
        before_pl.describe(), o.parallel.eplb.redundant, after_pl.describe(), placement_imbalance(before_pl, load),
        placement_imbalance(after_pl, load));

  nlohmann::json records = nlohmann::json::array();
  if (root)
    fmt::print("{:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}  {}\n", "tokens", "imb before", "imb after",
               "cmp before", "cmp after", "ms before", "ms after", "speed-up", "check");
  bool all_ok = true;
  const bool a2a = eo.comm != MoeComm::AllReduce && eo.comm != MoeComm::AllGather;
  for (const int64_t T : o.tokens) {
    const std::vector<Tensor> inputs = pool(T);
    std::string check = "skipped";
    if (!o.skip_check) {
      const Tensor yb = before->forward(inputs[0]), ya = after->forward(inputs[0]);
      bool ok = false;
      const int64_t n = std::min<int64_t>(T, 2);
      check = bench::check_sample(cfg, before->local().weights(), inputs[0].slice_rows(0, n), yb.slice_rows(0, n),
                                  dtype, &ok);
      if (a2a) {
        const bool same = yb.nbytes() == ya.nbytes() && std::memcmp(yb.raw(), ya.raw(), yb.nbytes()) == 0;
        ok = ok && same;
        check += same ? ", EPLB output bitwise equal" : ", EPLB output DIFFERS";
      } else {
        bool ok2 = false;
        bench::check_sample(cfg, before->local().weights(), inputs[0].slice_rows(0, n), ya.slice_rows(0, n), dtype,
                            &ok2);
        ok = ok && ok2;
      }
      float bad = ok ? 0.f : 1.f;
      world.all_reduce_sum(&bad, 1);
      if (bad > 0) check = fmt::format("FAILED on {} rank(s); rank 0: {}", static_cast<int>(bad), check);
      all_ok = all_ok && bad == 0;
    }
    const double imb_b = rank_imbalance(*before, inputs), imb_a = rank_imbalance(*after, inputs);
    const double t0 = now_s();
    before->forward(inputs[1]);
    double per_call = now_s() - t0;
    world.broadcast(&per_call, sizeof per_call, 0);
    const int n = static_cast<int>(std::clamp(o.seconds / 2 / std::max(per_call, 1e-6), 3.0, 2000.0));
    // Interleaved halves, so a drift of the machine's speed hits both alike.
    CallTime tb[2], ta[2];
    for (int half = 0; half < 2; ++half) {
      tb[half] = ms_per_call(*before, inputs, (n + 1) / 2);
      ta[half] = ms_per_call(*after, inputs, (n + 1) / 2);
    }
    const CallTime& bb = tb[0].ms <= tb[1].ms ? tb[0] : tb[1];
    const CallTime& aa = ta[0].ms <= ta[1].ms ? ta[0] : ta[1];
    const double ms_b = bb.ms, ms_a = aa.ms;
    if (root) {
      fmt::print("{:>6} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>7.2f}x  {}\n", T, imb_b, imb_a,
                 bb.compute_imbalance, aa.compute_imbalance, ms_b, ms_a, ms_a > 0 ? ms_b / ms_a : 0.0, check);
      records.push_back({{"tokens", T},
                         {"imbalance_before", imb_b},
                         {"imbalance_after", imb_a},
                         {"ms_before", ms_b},
                         {"ms_after", ms_a},
                         {"compute_imbalance_before", bb.compute_imbalance},
                         {"compute_imbalance_after", aa.compute_imbalance},
                         {"expert_load_max_over_mean", expert_skew},
                         {"redundant_experts", o.parallel.eplb.redundant},
                         {"skew", o.skew},
                         {"calls", n},
                         {"check", check},
                         {"moe_comm", o.parallel.moe_comm},
                         {"ranks", R},
                         {"shape", o.shape},
                         {"dtype", o.dtype}});
    }
  }
  // One online rebalance of the contiguous layer to the EPLB placement, with a call in
  // between while the slots travel: the stall is what the step loop waits (begin: copies
  // and posting; finish: what was still in flight, and the switch).
  {
    const std::vector<Tensor> inputs = pool(o.tokens.front());
    world.barrier();
    before->begin_rebalance(after_pl);
    before->forward(inputs[0]);
    const RebalanceStats st = before->finish_rebalance();
    double v[4] = {st.begin_s + st.finish_s, st.bytes_sent, static_cast<double>(st.slots_received), st.begin_s};
    std::vector<double> all(4 * R);
    world.all_gather(v, sizeof v, all.data());
    double stall = 0, bytes = 0, slots = 0, begin = 0;
    for (int r = 0; r < R; ++r) {
      if (all[4 * r] > stall) stall = all[4 * r], begin = all[4 * r + 3];
      bytes += all[4 * r + 1];
      slots += all[4 * r + 2];
    }
    if (root) {
      fmt::print("\nrebalance contiguous -> EPLB online: {:.0f} slots moved, {:.1f} MB sent over all ranks, the slowest "
                 "rank's step loop stalled {:.1f} ms ({:.1f} in begin: allocation, local copies, posting; the rest in "
                 "finish: the wait for what was still in flight)\n",
                 slots, bytes / 1e6, stall * 1e3, begin * 1e3);
      for (auto& r : records) {
        r["rebalance_stall_ms"] = stall * 1e3;
        r["rebalance_mb"] = bytes / 1e6;
      }
    }
  }
  if (root) {
    fmt::print(
        "\nimb: max over mean of the rows each EP rank's expert slots computed over {} calls; cmp: max over mean of "
        "the ranks' median compute\ntime per call; ms: the slowest rank's median per call (the better of two "
        "interleaved passes per placement). EPLB placed the calibration pool's "
        "load; the table's pools are other tokens.\n",
        kPool);
    if (!o.json_path.empty()) write_file_atomic(o.json_path, records.dump(2) + "\n", "--json");
    if (!all_ok) fmt::print(stderr, "moe-ep bench --eplb: the output check FAILED; the timings above are not valid\n");
  }
  return all_ok ? 0 : 2;
}

}  // namespace moe
