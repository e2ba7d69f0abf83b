// The moe-ep command line: one binary, one verb per job (see cli/verbs.h).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <exception>

#include "cli/verbs.h"
#include "comm/communicator.h"
#include "core/cpu.h"
#include "core/threads.h"

namespace {

struct GlobalOptions {
  int threads = 0;
  std::string isa;
};

void add_global(CLI::App* cmd, GlobalOptions& g) {
  cmd->add_option("--threads", g.threads,
                  "Worker threads for the kernels (default 0: OMP_NUM_THREADS when it is set, else the cores "
                  "of this machine divided among the ranks that mpirun started on it)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--isa", g.isa,
                  "Cap the instruction set the kernels use: portable, avx2, avx512, avx512bf16 or amx (AMX-INT8 "
                  "tiles for the prefill of int8-activation experts) (default: the best this CPU has; the MOE_ISA "
                  "environment variable does the same). A level this CPU does not have is an error")
      ->check(CLI::IsMember({"portable", "avx2", "avx512", "avx512bf16", "amx"}));
}

void apply_global(const GlobalOptions& g) {
  moe::set_num_threads(g.threads);
  // Both requests fail here, before any work, when this CPU lacks the level:
  // MOE_ISA is read by the first active_isa(), --isa is checked against the hardware.
  (void)moe::active_isa();
  if (!g.isa.empty()) moe::set_isa_cap(moe::parse_isa_request(g.isa, "--isa"));
}

// Prints the error; with other ranks alive, stops them too (they would otherwise
// wait in their next collective until the timeout).
[[noreturn]] void fail(const std::string& what) {
  if (moe::launched_by_mpi()) moe::world_comm().abort_all(std::string("error: ") + what);
  fmt::print(stderr, "moe-ep: error: {}\n", what);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-ep: Mixture-of-Experts inference with expert parallelism, on CPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moe-ep 0.1.0");
  GlobalOptions g;

  std::vector<moe::Verb> verbs = {moe::add_layer_verb(app), moe::add_bench_verb(app), moe::add_compare_verb(app)};
  for (auto& v : moe::add_inspect_verbs(app)) verbs.push_back(std::move(v));
  for (auto& v : moe::add_model_verbs(app)) verbs.push_back(std::move(v));
  for (auto& v : moe::add_text_verbs(app)) verbs.push_back(std::move(v));
  verbs.push_back(moe::add_chat_verb(app));
  verbs.push_back(moe::add_serve_verb(app));
  verbs.push_back(moe::add_bench_serve_verb(app));
  verbs.push_back(moe::add_eplb_verb(app));
  verbs.push_back(moe::add_plan_verb(app));
  for (auto& v : verbs) add_global(v.cmd, g);
  verbs.push_back(moe::add_launch_verb(app));  // runs no kernels: no --threads / --isa

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    apply_global(g);
    for (auto& v : verbs)
      if (v.cmd->parsed()) return v.run();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
}
