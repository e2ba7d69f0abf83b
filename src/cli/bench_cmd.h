// `moe-ep bench`: one MoE layer with random weights, timed per token count.
//
// It first checks the fast path against moe_reference on a sample of tokens, then
// times full layer calls (gate, route, experts, combine) with a fresh random input
// each call, so routing changes and the touched experts are not cache-warm. It
// reports against limits measured in the same run: the read bandwidth (the floor
// for decode: touched weight bytes / bandwidth) and the dot-product peak of the
// compute dtype (the ceiling for prefill).
#pragma once

#include <string>
#include <vector>

#include "cli/parallel_opts.h"
#include "core/dtype.h"

namespace CLI {
class App;
}

namespace moe {

struct BenchOptions {
  std::string shape = "qwen3-30b-a3b";
  int64_t hidden = 0, inter = 0, experts = 0, topk = 0;  // --shape custom
  int64_t shared_inter = -1;                              // --shape custom: shared experts' I (0: none)
  std::vector<int64_t> tokens = {1, 16, 128, 512};
  std::string dtype = "bf16";
  int64_t int4_group = 32;  // --dtype int4: k values per weight group
  double seconds = 2.0;  // time budget per token count
  std::string json_path;
  bool skip_check = false;
  // --skew zipf:S: the router prefers experts by a Zipf(S) popularity (bench_common.h
  // skew_router); empty or zipf:0: the plain random router.
  std::string skew;
  // --eplb (under mpirun): the contiguous placement against EPLB's placement of the
  // measured load (with --redundant-experts), side by side (cli/bench_eplb.cpp).
  bool eplb = false;
  ParallelOptions parallel;  // under mpirun: --ep/--tp/--moe-comm ...
};

void add_bench_options(CLI::App* cmd, BenchOptions& opt);
int run_bench_cmd(const BenchOptions& opt);
// The expert-parallel benchmark (cli/bench_ep.cpp): run under mpirun with --ep.
int run_bench_ep(const BenchOptions& opt, Communicator& world);
int run_bench_eplb(const BenchOptions& opt, Communicator& world);

}  // namespace moe
