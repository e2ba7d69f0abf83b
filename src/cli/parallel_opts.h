// The flags of expert parallelism, shared by every verb that runs MoE layers:
// --ep --tp --dp --moe-comm --max-tokens-per-rank --moe-chunk-tokens --no-overlap
// --comm-timeout, and those of expert placement and load balancing.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/groups.h"
#include "moe/ep_layer.h"
#include "moe/eplb.h"

namespace CLI {
class App;
}

namespace moe {

struct ParallelOptions {
  ParallelConfig par;
  std::string moe_comm = "auto";
  int64_t max_tokens_per_rank = 64;
  int64_t chunk_tokens = 0;
  bool no_overlap = false;
  bool vllm_enable_ep = false;  // --enable-expert-parallel (vLLM's spelling; an error)
  double comm_timeout = 300;
  // --redundant-experts --placement --eplb-interval --eplb-window --eplb-nodes
  EplbOptions eplb;

  EpOptions ep_options() const;
  std::string flags_string() const;  // for the cross-rank consistency check
};

void add_parallel_options(CLI::App* cmd, ParallelOptions& opt);
// add_parallel_options plus the layouts of whole models (generate, chat, serve):
// --attn-tp, and vLLM's --enable-expert-parallel as an error that names moe-ep's spelling.
void add_model_parallel_options(CLI::App* cmd, ParallelOptions& opt);

// The world for these options: MPI when launched by mpirun or when --ep/--tp/--dp ask
// for more than one rank; checks that ep * tp matches the world size.
Communicator& parallel_world(const ParallelOptions& opt);

// How the rows [0, T) of an input are laid out over R ranks for a strategy.
// allreduce: every rank gets all rows. Otherwise rows go to DP replicas (evenly,
// or `dp_tokens[g]` rows to replica g), and inside a replica the ranks split its
// rows evenly (sequence parallel). Returns (first row, rows) per rank.
std::vector<std::pair<int64_t, int64_t>> token_shares(int64_t n_tokens, int world, int dp, bool replicated,
                                                      const std::vector<int64_t>& dp_tokens);

}  // namespace moe
