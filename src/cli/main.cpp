// The moe-ep command line: one binary, one verb per job.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <exception>

#include "cli/bench_cmd.h"
#include "cli/compare_cmd.h"
#include "cli/layer_cmd.h"
#include "cli/parallel_opts.h"
#include "comm/communicator.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"

namespace {

struct GlobalOptions {
  int threads = 0;
  std::string isa;
};

void add_global(CLI::App* cmd, GlobalOptions& g) {
  cmd->add_option("--threads", g.threads,
                  "Worker threads for the kernels (default 0: every core this process may use)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--isa", g.isa,
                  "Cap the instruction set the kernels use: portable, avx2, avx512 or avx512bf16 "
                  "(default: the best this CPU has; the MOE_ISA environment variable does the same)")
      ->check(CLI::IsMember({"portable", "avx2", "avx512", "avx512bf16"}));
}

void apply_global(const GlobalOptions& g) {
  moe::set_num_threads(g.threads);  // 0: the cores divided among the ranks on this host
  if (!g.isa.empty()) moe::set_isa_cap(moe::parse_isa(g.isa));
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

  moe::LayerCmdOptions layer;
  std::string layer_dtype = "f32";
  CLI::App* lc = app.add_subcommand(
      "layer",
      "Run the MLP block (MoE or dense) of one decoder layer of a Hugging Face model on the tensor "
      "'hidden_states' [T, H] of --input, and write 'hidden_states' [T, H] f32 to --output");
  lc->add_option("--model", layer.model_dir, "Model directory: config.json and *.safetensors")
      ->required()
      ->check(CLI::ExistingDirectory);
  lc->add_option("--layer", layer.layer, "Decoder layer index (0-based)")->required();
  lc->add_option("--input", layer.input, "safetensors file holding 'hidden_states' [T, H] (f32, bf16 or f16)")
      ->required()
      ->check(CLI::ExistingFile);
  lc->add_option("--output", layer.output, "safetensors file to write ('hidden_states' [T, H] f32)")->required();
  lc->add_option("--dtype", layer_dtype,
                 "Compute dtype of the weights: f32, or bf16 (bf16 weights and activations, f32 accumulation)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  lc->add_flag("--quiet", layer.quiet, "Print nothing on success");
  lc->add_option("--dp-tokens", layer.dp_tokens,
                 "Rows of the input per DP replica, comma separated (uneven counts and zeros allowed; "
                 "default: an even split)")
      ->delimiter(',');
  moe::add_parallel_options(lc, layer.parallel);
  add_global(lc, g);

  moe::BenchOptions bench;
  CLI::App* bc = app.add_subcommand(
      "bench",
      "Benchmark one MoE layer with random weights: checks the output against the reference first, then "
      "prints time per call, tokens/s, weight GB/s and GFLOP/s against this machine's measured limits");
  moe::add_bench_options(bc, bench);
  add_global(bc, g);

  moe::CompareOptions cmp;
  CLI::App* cc = app.add_subcommand(
      "compare", "Compare one tensor of two safetensors files; exit 3 if any element is outside atol + rtol * |b|");
  cc->add_option("a", cmp.a, "First file (e.g. moe-ep's output)")->required()->check(CLI::ExistingFile);
  cc->add_option("b", cmp.b, "Second file, the reference")->required()->check(CLI::ExistingFile);
  cc->add_option("--tensor", cmp.tensor, "Tensor name to compare")->capture_default_str();
  cc->add_option("--atol", cmp.atol, "Absolute tolerance")->capture_default_str();
  cc->add_option("--rtol", cmp.rtol, "Relative tolerance (times |b|)")->capture_default_str();
  cc->add_option("--label", cmp.label, "Text printed before the result");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    apply_global(g);
    if (*lc) {
      layer.dtype = moe::parse_dtype(layer_dtype);
      moe::run_layer_cmd(layer);
    } else if (*bc) {
      return moe::run_bench_cmd(bench);
    } else if (*cc) {
      return moe::run_compare_cmd(cmp);
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
}
