#include "cli/parallel_opts.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace moe {

void add_parallel_options(CLI::App* cmd, ParallelOptions& o) {
  cmd->add_option("--ep", o.par.ep, "Expert-parallel size: routed experts are split over this many EP ranks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tp", o.par.tp,
                  "MoE tensor-parallel size: each expert's intermediate dimension is split over this many "
                  "consecutive ranks (world = ep * tp)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--dp", o.par.dp,
                  "Data-parallel attention replicas: each holds its own tokens (must divide the world size; "
                  "not with --moe-comm allreduce)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--moe-comm", o.moe_comm,
                  "How tokens reach their experts: allreduce (same tokens on every rank, partial outputs "
                  "all-reduced), allgather (own tokens, all-gather + reduce-scatter), alltoall (own tokens, "
                  "DeepEP-style dispatch/combine, EP-invariant output), alltoall-ll (fixed buffers for decode), "
                  "auto (alltoall-ll when every rank's tokens per call fit --max-tokens-per-rank, else alltoall)")
      ->check(CLI::IsMember({"allreduce", "allgather", "alltoall", "alltoall-ll", "auto"}))
      ->capture_default_str();
  cmd->add_option("--max-tokens-per-rank", o.max_tokens_per_rank,
                  "alltoall-ll: tokens one rank may send per call (sizes its fixed buffers)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--moe-chunk-tokens", o.chunk_tokens,
                  "Run MoE layers over chunks of at most this many tokens per rank (0: no chunking); bounds "
                  "dispatch buffers on long prompts")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--no-overlap", o.no_overlap,
                "Do not run the shared experts while the routed experts' communication is in flight");
  cmd->add_option("--comm-timeout", o.comm_timeout,
                  "Seconds any rank may wait in one collective before the job is aborted with an error")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--redundant-experts", o.eplb.redundant,
                  "Extra expert slots over the EP ranks (replicas of hot experts; experts + R must divide by --ep); "
                  "placed by EPLB on a uniform load until --eplb-interval rebalances them")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--placement", o.eplb.placement_file,
                  "JSON file of expert slots per EP rank and MoE layer (as `moe-ep eplb` writes it)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--eplb-interval", o.eplb.interval,
                  "Rebalance the expert slots every this many steps from the routed-token counts (0: never); the "
                  "all-to-all strategies' output stays bitwise the same")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--eplb-window", o.eplb.window,
                  "Steps of expert load statistics a rebalance uses (0: the last --eplb-interval steps)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--eplb-nodes", o.eplb.nodes,
                  "Hosts the EP ranks span (blocks of consecutive ranks): EPLB keeps expert groups inside a host "
                  "when the router's groups divide by it")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void add_model_parallel_options(CLI::App* cmd, ParallelOptions& o) {
  add_parallel_options(cmd, o);
  cmd->add_option("--attn-tp", o.par.attn_tp,
                  "Attention tensor-parallel over the EP group (vLLM's --tensor-parallel-size N "
                  "--enable-expert-parallel, the seed's layout): attention heads, the KV cache (GQA), the shared "
                  "experts, dense MLP layers and the vocabulary (embedding and lm_head rows) are split over the ranks "
                  "of a DP replica (must equal world / --dp), while each routed expert stays whole on its EP rank. "
                  "With --dp 1 and "
                  "--moe-comm auto or allreduce every MoE layer ends in one all-reduce of routed + shared partial "
                  "outputs; with the all-to-all strategies or --dp > 1 each rank of a replica dispatches its share of "
                  "the rows and the replica gathers them back. Every rank reads 1/N of the attention, shared-expert "
                  "and lm_head bytes per token instead of all of them; --ep defaults to world. 1: attention "
                  "replicated over the EP ranks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // --attn-tp N alone: the experts are EP over the same ranks (world = N x --dp), as
  // in vLLM's layout, so --ep defaults to them.
  cmd->parse_complete_callback([cmd, &o] {
    if (o.par.attn_tp > 1 && cmd->count("--ep") == 0 && o.par.tp == 1) o.par.ep = o.par.attn_tp * o.par.dp;
  });
  cmd->add_flag("--enable-expert-parallel", o.vllm_enable_ep,
                "vLLM's spelling, not moe-ep's: an error that names the moe-ep flags for the same layout");
}

EpOptions ParallelOptions::ep_options() const {
  EpOptions e;
  e.comm = parse_moe_comm(moe_comm);
  e.max_tokens_per_rank = max_tokens_per_rank;
  e.chunk_tokens = chunk_tokens;
  e.overlap = !no_overlap;
  return e;
}

std::string ParallelOptions::flags_string() const {
  return fmt::format(
      "{} --moe-comm {} --max-tokens-per-rank {} --moe-chunk-tokens {}{} --redundant-experts {} --placement '{}' "
      "--eplb-interval {} --eplb-window {} --eplb-nodes {}",
      to_string(par), moe_comm, max_tokens_per_rank, chunk_tokens, no_overlap ? " --no-overlap" : "", eplb.redundant,
      eplb.placement_file, eplb.interval, eplb.window, eplb.nodes);
}

Communicator& parallel_world(const ParallelOptions& o) {
  // moe-ep's --tp is MoE-TP (each expert's I split); vLLM's --tensor-parallel-size with
  // --enable-expert-parallel is attention TP with whole experts: --ep N --attn-tp N here.
  MOE_CHECK(!o.vllm_enable_ep,
            "--enable-expert-parallel is vLLM's flag: moe-ep always runs the routed experts expert-parallel over "
            "--ep ranks. For vLLM's --tensor-parallel-size N --enable-expert-parallel (attention split N ways, "
            "experts whole, EP over the same N ranks) run mpirun -np N moe-ep ... --ep N --attn-tp N; moe-ep's "
            "--tp splits every expert's intermediate size instead");
  const bool want = o.par.ep * o.par.tp > 1 || o.par.dp > 1 || o.par.attn_tp > 1;
  const int ranks = std::max(o.par.ep * o.par.tp, o.par.attn_tp * o.par.dp);
  MOE_CHECK(!want || launched_by_mpi(), "{} needs {} ranks: start it as mpirun -np {} moe-ep ...", to_string(o.par),
            ranks, ranks);
  Communicator& world = world_comm(want);
  world.set_timeout(o.comm_timeout);
  validate_parallel_config(o.par, world.size());
  if (world.size() == 1) {
    // Nothing travels between ranks here: say so once instead of ignoring the flags.
    const ParallelOptions dflt;
    std::string unused;
    if (o.moe_comm != dflt.moe_comm) unused += " --moe-comm " + o.moe_comm;
    if (o.max_tokens_per_rank != dflt.max_tokens_per_rank)
      unused += " --max-tokens-per-rank " + std::to_string(o.max_tokens_per_rank);
    if (o.no_overlap) unused += " --no-overlap";
    if (!unused.empty())
      fmt::print(stderr,
                 "moe-ep: note:{} do nothing on one rank (no communication; --moe-chunk-tokens does apply: it "
                 "bounds each MoE call's rows)\n",
                 unused);
  }
  MOE_CHECK(!(o.moe_comm == "allreduce" && o.par.dp > 1),
            "--moe-comm allreduce needs every rank to hold the same tokens: use --dp 1, or allgather/alltoall with "
            "--dp {}",
            o.par.dp);
  return world;
}

std::vector<std::pair<int64_t, int64_t>> token_shares(int64_t T, int R, int dp, bool replicated,
                                                      const std::vector<int64_t>& dp_tokens) {
  std::vector<std::pair<int64_t, int64_t>> out(R);
  if (replicated) {
    for (auto& s : out) s = {0, T};
    return out;
  }
  MOE_CHECK(dp >= 1 && R % dp == 0, "--dp {} must divide the {} ranks", dp, R);
  std::vector<int64_t> per(dp);
  if (!dp_tokens.empty()) {
    MOE_CHECK(static_cast<int>(dp_tokens.size()) == dp, "--dp-tokens lists {} counts, expected one per DP replica ({})",
              dp_tokens.size(), dp);
    for (int64_t c : dp_tokens) MOE_CHECK(c >= 0, "--dp-tokens counts must not be negative (got {})", c);
    const int64_t sum = std::accumulate(dp_tokens.begin(), dp_tokens.end(), int64_t{0});
    MOE_CHECK(sum == T, "--dp-tokens sums to {}, but the input has {} tokens", sum, T);
    per = dp_tokens;
  } else {
    for (int g = 0; g < dp; ++g) per[g] = T * (g + 1) / dp - T * g / dp;
  }
  const int s = R / dp;
  int64_t first = 0;
  for (int g = 0; g < dp; ++g) {
    for (int i = 0; i < s; ++i) {
      const int64_t b = per[g] * i / s, e = per[g] * (i + 1) / s;
      out[g * s + i] = {first + b, e - b};
    }
    first += per[g];
  }
  return out;
}

}  // namespace moe
