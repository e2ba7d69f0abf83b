// `mpirun -np N moe-ep bench --ep N --moe-comm X`: one MoE layer under expert
// parallelism. Per token count it checks a sample of every rank's output against
// the reference, then reports per call (the slowest rank's median): total time,
// compute, shared experts, time blocked in communication, bytes sent per rank; for
// the all-to-all strategies the communication bandwidth against a raw
// MPI_Alltoallv of the same bytes timed in the same run; and, with shared experts,
// what running them during the communication saves (a pass with --no-overlap).
#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "cli/bench_cmd.h"
#include "cli/bench_common.h"
#include "comm/groups.h"
#include "core/check.h"
#include "core/threads.h"
#include "moe/ep_layer.h"
#include "moe/placement_file.h"
#include "moe/slot_weights.h"

namespace moe {

namespace {

using bench::max_over_ranks;
using bench::median;

struct Timing {
  double total = 0, compute = 0, shared = 0, comm = 0, bytes = 0, dispatch = 0;
  // The least blocked rank's median comm: the last rank to arrive waits only for the
  // exchange itself; what other ranks wait beyond it is the peers' compute (imbalance).
  double comm_last = 0;
};

// Runs n calls; per-rank medians of each part, then the max over ranks.
Timing time_calls(EpMoeLayer& layer, const std::vector<Tensor>& inputs, int n) {
  std::vector<double> tot, comp, sh, comm, bytes, disp;
  for (int i = 0; i < n; ++i) {
    const Tensor& x = inputs[i % inputs.size()];
    const double t0 = now_s();
    layer.forward(x);
    tot.push_back(now_s() - t0);
    const EpStats& s = layer.stats();
    comp.push_back(s.compute_s);
    sh.push_back(s.shared_s);
    comm.push_back(s.comm_wait_s);
    bytes.push_back(s.bytes_sent);
    disp.push_back(s.dispatch_bytes);
  }
  Communicator& c = layer.comm();
  return {max_over_ranks(c, median(tot)),   max_over_ranks(c, median(comp)),  max_over_ranks(c, median(sh)),
          max_over_ranks(c, median(comm)),  max_over_ranks(c, median(bytes)), max_over_ranks(c, median(disp)),
          -max_over_ranks(c, -median(comm))};
}

// A plain all-to-all-v moving `bytes` per call from this rank, split evenly over the
// other ranks and over two exchanges (dispatch and combine), like the strategies.
// Returns the slowest rank's median seconds per call (both exchanges).
double raw_alltoall_s(Communicator& c, double bytes, int n) {
  const int R = c.size();
  const size_t per = static_cast<size_t>(bytes / 2 / std::max(1, R - 1));
  std::vector<char> send(per * R), recv(per * R);
  std::vector<size_t> sb(R, per), off(R);
  for (int r = 0; r < R; ++r) off[r] = r * per;
  sb[c.rank()] = 0;
  std::vector<double> t;
  c.all_to_all_v(send.data(), sb, off, recv.data(), sb, off);  // warm-up
  for (int i = 0; i < n; ++i) {
    c.barrier();
    const double t0 = now_s();
    c.all_to_all_v(send.data(), sb, off, recv.data(), sb, off);
    c.all_to_all_v(send.data(), sb, off, recv.data(), sb, off);
    t.push_back(now_s() - t0);
  }
  return max_over_ranks(c, median(t));
}

}  // namespace

int run_bench_ep(const BenchOptions& o, Communicator& world) {
  const MoeConfig cfg = bench::bench_config(o);
  MOE_CHECK(bench::dtype_list(o.dtype).size() == 1,
            "under mpirun bench takes one --dtype (got '{}'): run once per dtype", o.dtype);
  int64_t int4_group = 0;
  const DType dtype = bench::bench_dtype(o.dtype, o.int4_group, &int4_group);
  const ParallelConfig& par = o.parallel.par;
  const int R = world.size(), rank = world.rank();
  ParallelGroups groups(world, par);
  MOE_CHECK(o.parallel.eplb.interval == 0, "bench times single calls: --eplb-interval applies to generate and serve");
  const Placement pl = PlacementSource(o.parallel.eplb, cfg.n_experts, par.ep, par.tp,
                                       static_cast<int>(cfg.routing.n_group), &world)
                           .layer(0);
  const double skew = bench::parse_skew(o.skew);
  const EpOptions eo = o.parallel.ep_options();
  const bool replicated = eo.comm == MoeComm::AllReduce;
  const int64_t H = cfg.hidden_size;
  const bool root = rank == 0;

  const double t_build = now_s();
  MoeLayerWeights w = load_slot_weights(pl, groups.ep_rank(), [&](int64_t b, int64_t e) {
    return bench::random_layer(cfg, dtype, b, e, groups.tp_rank(), par.tp, int4_group);
  });
  bench::skew_router(cfg, w, skew);
  EpMoeLayer layer(MoeLayer(cfg, std::move(w)), world, pl, eo);
  world.barrier();
  if (root)
    fmt::print(
        "moe-ep bench: shape {} (H={} I={} E={} k={} shared I={}), dtype {}, {} ranks ({}), moe-comm {}, {} threads "
        "per rank\n  this rank's experts built in {:.1f} s; placement {}\n\n",
        o.shape, H, cfg.moe_intermediate_size, cfg.n_experts, cfg.top_k, cfg.shared_intermediate_size, o.dtype, R,
        to_string(par), o.parallel.moe_comm, num_threads(), now_s() - t_build, pl.describe());

  nlohmann::json records = nlohmann::json::array();
  if (root)
    fmt::print("{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>7} {:>8} {:>8} {:>6} {:>9} {:>7}  {}\n",
               "tokens", "ms/call", "compute", "shared", "comm", "no-ovl", "MB/rank", "disp MB", "comm GB/s", "raw GB/s",
               "frac", "raw ms", "last ms", "x raw", "saved ms", "hidden", "check");
  bool all_ok = true;
  for (int64_t T : o.tokens) {
    // Each rank's own tokens (the same tokens everywhere for allreduce).
    constexpr int kPool = 8;
    std::vector<Tensor> inputs;
    for (int i = 0; i < kPool; ++i) {
      inputs.push_back(bench::random_tensor({T, H}, 1.f, 1000003ull * T + i + (replicated ? 0 : 7919ull * rank)));
      if (skew > 0) bench::skew_inputs(inputs.back());
    }

    std::string check = "skipped";
    if (!o.skip_check) {
      const Tensor y = layer.forward(inputs[0]);
      const int64_t n = std::min<int64_t>(T, 2);
      bool ok = false;
      check = bench::check_sample(cfg, layer.local().weights(), inputs[0].slice_rows(0, n), y.slice_rows(0, n), dtype,
                                  &ok);
      float bad = ok ? 0.f : 1.f;
      world.all_reduce_sum(&bad, 1);
      if (bad > 0) check = fmt::format("FAILED on {} rank(s); rank 0: {}", static_cast<int>(bad), check);
      all_ok = all_ok && bad == 0;
    }
    // Calls per pass: as many as fit the time budget (rank 0 decides for everyone).
    const double t0 = now_s();
    layer.forward(inputs[1]);
    double per_call = now_s() - t0;
    world.broadcast(&per_call, sizeof per_call, 0);
    const int n = static_cast<int>(std::clamp(o.seconds / std::max(per_call, 1e-6), 3.0, 2000.0));

    layer.set_overlap(true);
    const Timing ov = time_calls(layer, inputs, n);
    Timing no = ov;
    if (cfg.shared_intermediate_size > 0) {
      layer.set_overlap(false);
      no = time_calls(layer, inputs, n);
      layer.set_overlap(true);
    }
    const bool a2a = eo.comm == MoeComm::AllToAll || eo.comm == MoeComm::AllToAllLL || eo.comm == MoeComm::Auto;
    const double comm_gbps = no.comm > 0 ? no.bytes / no.comm / 1e9 : 0;
    const double raw_s = a2a && R > 1 ? raw_alltoall_s(world, no.bytes, n) : 0;
    const double raw = raw_s > 0 ? no.bytes / raw_s / 1e9 : 0;
    const double saved = no.total - ov.total;
    const double hidden = ov.shared > 0 ? saved / ov.shared : 0;
    if (root) {
      fmt::print(
          "{:>6} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>10.3f} {:>9.3f} {:>9.2f} {:>9.2f} {:>7.2f} {:>8.3f} "
          "{:>8.3f} {:>6.2f} {:>9.3f} {:>6.0f}%  {}\n",
          T, ov.total * 1e3, ov.compute * 1e3, ov.shared * 1e3, ov.comm * 1e3, no.total * 1e3, no.bytes / 1e6,
          no.dispatch / 1e6, comm_gbps, raw, raw > 0 ? comm_gbps / raw : 0.0, raw_s * 1e3, no.comm_last * 1e3,
          raw_s > 0 ? no.comm_last / raw_s : 0.0, saved * 1e3, hidden * 100, check);
      records.push_back({{"tokens", T},
                         {"ms_per_call", ov.total * 1e3},
                         {"compute_ms", ov.compute * 1e3},
                         {"shared_ms", ov.shared * 1e3},
                         {"comm_ms", ov.comm * 1e3},
                         {"no_overlap_ms", no.total * 1e3},
                         {"bytes_per_rank", no.bytes},
                         {"dispatch_bytes_per_rank", no.dispatch},
                         {"comm_gbps", comm_gbps},
                         {"raw_alltoallv_gbps", raw},
                         {"raw_exchange_ms", raw_s * 1e3},
                         {"comm_last_ms", no.comm_last * 1e3},
                         {"comm_last_over_raw", raw_s > 0 ? no.comm_last / raw_s : 0.0},
                         {"comm_frac_of_call", ov.total > 0 ? ov.comm / ov.total : 0.0},
                         {"overlap_saved_ms", saved * 1e3},
                         {"shared_hidden_frac", hidden},
                         {"calls", n},
                         {"check", check},
                         {"moe_comm", o.parallel.moe_comm},
                         {"ranks", R},
                         {"shape", o.shape},
                         {"dtype", o.dtype}});
    }
  }
  if (root) {
    fmt::print(
        "\nms/call: the slowest rank's median per call; compute/shared/comm: its parts (comm: time blocked in "
        "communication);\nMB/rank: bytes a rank sent per call (both directions); disp MB: of those, the dispatch (tokens "
        "to experts; alltoall, alltoall-ll);\nno-ovl: ms/call with the shared experts run after the communication instead of during it; "
        "saved = no-ovl - ms/call,\nhidden = saved / shared. comm GB/s: bytes this rank sent per call / comm time "
        "(no-overlap pass); raw: MPI all-to-all-v of the same bytes,\nraw ms: two of them (the dispatch and "
        "combine exchanges of a call) timed alone; last ms: the least blocked rank's comm (the last to\narrive "
        "waits for the exchange only: the rest of comm is waiting for the peers' compute); x raw = last ms / raw ms.\n");
    if (!o.json_path.empty()) {
      write_file_atomic(o.json_path, records.dump(2) + "\n", "--json");
    }
    if (!all_ok) fmt::print(stderr, "moe-ep bench: the output check FAILED; the timings above are not valid\n");
  }
  return all_ok ? 0 : 2;
}

}  // namespace moe
