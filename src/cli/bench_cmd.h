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

#include "core/dtype.h"

namespace CLI {
class App;
}

namespace moe {

struct BenchOptions {
  std::string shape = "qwen3-30b-a3b";
  int64_t hidden = 0, inter = 0, experts = 0, topk = 0;  // --shape custom
  std::vector<int64_t> tokens = {1, 16, 128, 512};
  std::string dtype = "bf16";
  double seconds = 2.0;  // time budget per token count
  std::string json_path;
  bool skip_check = false;
};

void add_bench_options(CLI::App* cmd, BenchOptions& opt);
int run_bench_cmd(const BenchOptions& opt);

}  // namespace moe
