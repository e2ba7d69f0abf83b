#include "core/atomic_file.h"
#include "cli/bench_cmd.h"

#include "cli/bench_common.h"
#include "cli/verbs.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <map>
#include <set>

#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "kernels/probes.h"
#include "moe/config.h"
#include "moe/fused_moe.h"
#include "moe/reference.h"

namespace moe {

using bench::random_tensor;

void add_bench_options(CLI::App* cmd, BenchOptions& o) {
  cmd->add_option("--shape", o.shape, "Layer shape: a preset of a public checkpoint, or custom (" +
                                          bench::shape_names() + ")")
      ->check([](const std::string& v) { return bench::is_shape(v) ? std::string() : "unknown shape " + v; })
      ->capture_default_str();
  cmd->add_option("--hidden", o.hidden, "Hidden size H (with --shape custom)")->check(CLI::PositiveNumber);
  cmd->add_option("--inter", o.inter, "Expert intermediate size I (with --shape custom)")->check(CLI::PositiveNumber);
  cmd->add_option("--experts", o.experts, "Routed experts E (with --shape custom)")->check(CLI::PositiveNumber);
  cmd->add_option("--topk", o.topk, "Experts per token k (with --shape custom)")->check(CLI::PositiveNumber);
  cmd->add_option("--shared-inter", o.shared_inter,
                  "Intermediate size of the shared experts (with --shape custom; default none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--tokens", o.tokens, "Token counts per call, comma separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "Compute dtype: bf16, f32, int8 (W8A8 routed experts; router f32, shared experts bf16) or fp8 "
                  "(routed experts e4m3 with 128x128 block scales, dequantised to bf16 inside the GEMM) or int4 (W4A8 "
                  "routed experts: 4-bit weights in groups of --int4-group, int8 activations) or q8_0, q5_0, q4_0 "
                  "(routed experts in the codes a GGUF of that type loads into: 8-, 6- or 4-bit codes in groups of 32 "
                  "with an f16 scale, int8 activations); a comma list (e.g. bf16,int8,int4,fp8) benchmarks each in "
                  "turn and compares them")
      ->check([](const std::string& v) {
        for (const std::string& d : bench::dtype_list(v))
          if (d != "f32" && d != "bf16" && d != "int8" && d != "int4" && d != "fp8" && d != "q8_0" && d != "q5_0" &&
              d != "q4_0")
            return "unknown dtype " + d + " (f32, bf16, int8, int4, fp8, q8_0, q5_0, q4_0)";
        return std::string();
      })
      ->capture_default_str();
  cmd->add_option("--int4-group", o.int4_group, "With --dtype int4: input values per weight group (32, 64 or 128)")
      ->check(CLI::IsMember({int64_t{32}, int64_t{64}, int64_t{128}}))
      ->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "Time budget per token count (at least 3 calls are timed)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--json", o.json_path, "Also write the results as a JSON list, one record per token count");
  cmd->add_flag("--skip-check", o.skip_check, "Do not check the output against the reference first");
  cmd->add_option("--skew", o.skew,
                  "zipf:S: skewed routing, the router prefers experts by a Zipf(S) popularity (a fixed random order "
                  "of the experts; S = 0: uniform)");
  cmd->add_flag("--eplb", o.eplb,
                "Under mpirun: time the contiguous expert placement and EPLB's placement of the measured load "
                "(with --redundant-experts R) side by side");
  add_parallel_options(cmd, o.parallel);
}

namespace {

// One dtype's pass: prints its table, appends its records, returns whether the check passed.
bool bench_one_dtype(const BenchOptions& o, const std::string& dtype_str, nlohmann::json& records,
                     std::map<int64_t, double>& ms_per_call) {
  const MoeConfig cfg = bench::bench_config(o);
  int64_t int4_group = 0;
  std::optional<CodedFormat> coded;
  const DType dtype = bench::bench_dtype(dtype_str, o.int4_group, &int4_group, &coded);
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts, k = cfg.top_k;
  const int threads = num_threads();

  fmt::print("moe-ep bench: shape {} (H={} I={} E={} k={}), dtype {}, {} threads\n  cpu: {}\n", o.shape, H, I, E,
             k, dtype_str, threads, cpu_summary());
  const double t_build = now_s();
  MoeLayer layer(cfg, bench::random_layer(cfg, dtype, 0, E, 0, 1, int4_group, coded ? &*coded : nullptr));
  // Int4: nibbles + scales + zero points; FP8: codes + block scales.
  const size_t expert_bytes = bench::expert_read_bytes(layer.weights());
  const double gate_bytes = double(E) * H * 4;
  fmt::print("  weights: {:.2f} GB of experts ({:.1f} MB each), built in {:.1f} s\n",
             double(expert_bytes) * E / 1e9, expert_bytes / 1e6, now_s() - t_build);

  // Limits, measured now, on the same threads. The read buffer is 8x the L3 size class
  // (>= 256 MB) so the probe streams from DRAM like decode does.
  const double bw_probe = measure_read_bandwidth_gbs(size_t(512) << 20, threads);
  // The same streaming read over the expert weights' own pages: on a VM, memory
  // regions can differ in speed, and decode is bound by reading exactly these bytes.
  const PackedExperts& w13 = layer.weights().w13;
  const PackedExperts& w2 = layer.weights().w2;
  const double b13 = double(w13.data.nbytes()), b2 = double(w2.data.nbytes());
  auto weights_bw = [&] {
    return (b13 + b2) / (b13 / measure_read_bandwidth_gbs_of(w13.data.raw(), w13.data.nbytes(), threads) +
                         b2 / measure_read_bandwidth_gbs_of(w2.data.raw(), w2.data.nbytes(), threads));
  };
  const double bw_weights = weights_bw();
  const double bw = std::min(bw_probe, bw_weights);
  // The peak of the instructions this dtype's kernel runs at the active ISA level
  // (kernels/probes.h, kernel_peak_probe): e.g. bf16 on AVX2 widens to f32 and FMAs.
  const PeakProbe probe = kernel_peak_probe(dtype, int4_group > 0 || coded.has_value());
  const double peak = measure_peak(probe, threads);
  fmt::print("  limits: read bandwidth {:.1f} GB/s (512 MB probe buffer {:.1f}, the weights themselves {:.1f}), "
             "peak: {} {:.0f} {}\n\n",
             bw, bw_probe, bw_weights, peak_probe_name(probe), peak, peak_probe_unit(probe));

  fmt::print("{:>7} {:>10} {:>11} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8}  {}\n", "tokens", "ms/call", "tokens/s",
             "experts", "GB/s", "frac_bw", "GFLOP/s", "frac_pk", "calls", "check");
  bool all_ok = true;
  for (int64_t T : o.tokens) {
    constexpr int kPool = 16;
    std::vector<Tensor> inputs;
    for (int i = 0; i < kPool; ++i)
      inputs.push_back(random_tensor({T, H}, 1.f, 1000003ull * T + i));

    std::string check = "skipped";
    if (!o.skip_check) {
      const int64_t n = std::min<int64_t>(T, 4);
      const Tensor x = inputs[0];
      const Tensor y = layer.forward(x);
      bool ok = false;
      check = bench::check_sample(cfg, layer.weights(), x.slice_rows(0, n), y.slice_rows(0, n), dtype, &ok);
      all_ok = all_ok && ok;

    }

    layer.forward(inputs[1]);  // warm-up: scratch buffers, thread pool
    const double bw_before = weights_bw();
    std::vector<double> times;
    double touched = 0;
    const double t_end = now_s() + o.seconds;
    Routing r;
    for (int i = 0; times.size() < 3 || now_s() < t_end; ++i) {
      const Tensor& x = inputs[(i + 2) % kPool];
      const double t0 = now_s();
      layer.forward(x);
      times.push_back(now_s() - t0);
      // Distinct experts this call touched (routing once more, outside the timed part).
      layer.route(x, r);
      int64_t used = 0;
      for (int64_t e = 0; e < E; ++e) used += r.index.counts[e] > 0;
      touched += used;
      if (times.size() >= 10000) break;
    }
    std::sort(times.begin(), times.end());
    const double t_med = times[times.size() / 2];
    const double experts_avg = touched / times.size();
    const double S = double(cfg.shared_intermediate_size);
    const double bytes =
        experts_avg * expert_bytes + gate_bytes + 3.0 * H * S * dtype_size(dtype == DType::I8 || dtype == DType::F8E4M3 ? DType::BF16 : dtype);
    ms_per_call[T] = t_med * 1e3;
    const double flops = 2.0 * T * k * (3.0 * H * I) + 2.0 * T * E * H + 2.0 * T * 3.0 * H * S;
    const double gbps = bytes / t_med / 1e9, gflops = flops / t_med / 1e9;
    // This VM's read bandwidth drifts by up to 2x over minutes, so the floor of each row
    // uses the best of the start-up probe and two reads of the weights taken right
    // before and after the row's timing: a conservative (high) limit.
    const double bw_row = std::max({bw, bw_before, weights_bw()});
    const double frac_bw = gbps / bw_row, frac_peak = gflops / peak;  // both limits > 0 (probes.h)
    fmt::print("{:>7} {:>10.3f} {:>11.1f} {:>9.1f} {:>9.1f} {:>8.2f} {:>9.1f} {:>8.2f} {:>8}  {}\n", T, t_med * 1e3,
               T / t_med, experts_avg, gbps, frac_bw, gflops, frac_peak, times.size(), check);
    records.push_back({{"tokens", T},
                       {"ms_per_call", t_med * 1e3},
                       {"tokens_per_s", T / t_med},
                       {"gflops", gflops},
                       {"weight_gbps", gbps},
                       {"frac_bw", frac_bw},
                       {"frac_peak", frac_peak},
                       {"experts_touched", experts_avg},
                       {"calls", times.size()},
                       {"check", check},
                       {"shape", o.shape},
                       {"dtype", dtype_str},
                       {"threads", threads},
                       {"read_bw_gbs", bw},
                       {"peak_gflops", peak},
                       {"peak_name", peak_probe_name(probe)},
                       {"peak_unit", peak_probe_unit(probe)}});
  }
  fmt::print(
      "\nfrac_bw = weight GB/s / read bandwidth, i.e. the DRAM floor (bytes of the weights a call touches / read "
      "bandwidth)\nover ms/call. Bytes touched: W13 + W2 of the distinct routed experts the call's tokens chose "
      "(counted from\nthe routing of each timed call){}, the f32 router and the shared experts. Read bandwidth of a "
      "row: the highest of\nmin(512 MB probe buffer, the packed W13 + W2 themselves) read at start-up and the packed "
      "W13 + W2 read again\nright before and right after the row; every read streams the whole buffer once with "
      "{} loads on {} threads,\nbest of 5.\n"
      "frac_pk = {} / peak {}: {} on {} threads, operands in\n{}, best of 3 by thread CPU time, at start-up ({} kernel at "
      "{}). {} = 2 x multiply-adds (routed k x 3HI, router EH, shared 3HS per token).\n\n",
      dtype == DType::F8E4M3 ? " + their fp8 block scales" : "", read_probe_loads(), threads,
      dtype == DType::I8 ? "GOP/s" : "GFLOP/s", peak_probe_name(probe), peak_probe_what(probe), threads,
      probe == PeakProbe::Bf16AmxTile || probe == PeakProbe::I8AmxTile ? "tiles" : "registers (or L1)", dtype_str,
      isa_name(active_isa()), dtype == DType::I8 ? "GOP" : "GFLOP");
  if (!all_ok) fmt::print(stderr, "moe-ep bench: the {} output check FAILED; its timings are not valid\n", dtype_str);
  return all_ok;
}

}  // namespace

int run_bench_cmd(const BenchOptions& o) {
  Communicator& world = parallel_world(o.parallel);
  if (world.size() > 1) return o.eplb ? run_bench_eplb(o, world) : run_bench_ep(o, world);
  MOE_CHECK(!o.eplb && o.skew.empty() && !o.parallel.eplb.any(),
            "--eplb, --skew, --redundant-experts and --placement concern experts split over EP ranks: run under "
            "mpirun with --ep > 1");
  const std::vector<std::string> dts = bench::dtype_list(o.dtype);
  nlohmann::json records = nlohmann::json::array();
  std::vector<std::map<int64_t, double>> ms(dts.size());
  bool all_ok = true;
  for (size_t i = 0; i < dts.size(); ++i) all_ok = bench_one_dtype(o, dts[i], records, ms[i]) && all_ok;
  if (dts.size() > 1) {
    fmt::print("ms/call side by side (speed-up = {} ms / other ms):\n{:>7}", dts[0], "tokens");
    for (const auto& d : dts) fmt::print(" {:>10}", d);
    for (size_t i = 1; i < dts.size(); ++i) fmt::print(" {:>12}", "x vs " + dts[0]);
    fmt::print("\n");
    for (int64_t T : o.tokens) {
      fmt::print("{:>7}", T);
      for (size_t i = 0; i < dts.size(); ++i) fmt::print(" {:>10.3f}", ms[i][T]);
      for (size_t i = 1; i < dts.size(); ++i) fmt::print(" {:>12.2f}", ms[0][T] / ms[i][T]);
      fmt::print("\n");
    }
  }
  if (!o.json_path.empty()) {
    write_file_atomic(o.json_path, records.dump(2) + "\n", "--json");
  }
  if (!all_ok) fmt::print(stderr, "moe-ep bench: the output check FAILED; the timings above are not valid\n");
  return all_ok ? 0 : 2;
}

Verb add_bench_verb(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* bc = app.add_subcommand(
      "bench",
      "Benchmark one MoE layer with random weights: checks the output against the reference first, then "
      "prints time per call, tokens/s, weight GB/s and GFLOP/s against this machine's measured limits");
  add_bench_options(bc, *opt);
  return {bc, [opt] { return run_bench_cmd(*opt); }};
}

}  // namespace moe
