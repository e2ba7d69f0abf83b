// Whole-model verbs: `forward` (prefill logits of a batch of prompts) and `generate`
// (prefill + decode with greedy or sampled tokens). Both run on one rank or under
// mpirun with the parallel flags (cli/parallel_opts.h; layouts in model/model.h).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include "cli/parallel_opts.h"
#include "cli/verbs.h"
#include "comm/consistency.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "loader/safetensors.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/runner.h"

namespace moe {

namespace {

struct CommonOpts {
  std::string model_dir, prompt_ids, dtype = "f32", quantize = "none";
  int64_t max_seq_len = 0;
  ParallelOptions parallel;
};

// "bf16" or "bf16 (routed experts w8a8)", for the summaries.
std::string weights_desc(const CommonOpts& o) {
  return o.quantize == "none" ? o.dtype : fmt::format("{} (routed experts {})", o.dtype, o.quantize);
}

void add_common(CLI::App* cmd, CommonOpts& o) {
  cmd->add_option("--model", o.model_dir, "Model directory: config.json and *.safetensors (Hugging Face layout)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt-ids", o.prompt_ids,
                  "Prompts as token ids: ids separated by ',', prompts by ';' (e.g. \"1,2,3;4,5\"); all prompts run "
                  "as one batch")
      ->required();
  cmd->add_option("--dtype", o.dtype,
                  "Weight dtype: f32, or bf16 (bf16 weights and GEMM inputs, f32 activations and accumulation)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--quantize", o.quantize,
                  "Quantise the routed experts at load: w8a8 = SmoothQuant int8 weights (per-output-channel scales "
                  "absmax/127, smooth = 1) and per-token dynamic int8 activations; the router stays f32, and the "
                  "shared experts, dense MLP layers, attention and lm_head stay in --dtype. With --moe-comm alltoall "
                  "or alltoall-ll the tokens travel as int8 rows and the logits equal the one-rank W8A8 logits bit for "
                  "bit; under --tp each rank quantises its slice of the intermediate dimension (W2 scales and GEMM2 "
                  "activation scales over that slice), so the logits are close to, not equal to, one rank's")
      ->check(CLI::IsMember({"none", "w8a8"}))
      ->capture_default_str();
  cmd->add_option("--max-seq-len", o.max_seq_len,
                  "Positions per sequence in the KV cache, allocated up front (default: the longest prompt plus "
                  "--max-new-tokens); a request that does not fit is an error")
      ->check(CLI::NonNegativeNumber);
  add_parallel_options(cmd, o.parallel);
}

struct Loaded {
  Communicator* world = nullptr;
  std::unique_ptr<Model> model;
  std::vector<std::vector<int32_t>> prompts;
  double load_s = 0;
};

Loaded load(const CommonOpts& o, int64_t max_new, bool count_experts, const std::string& extra_flags) {
  const auto t0 = std::chrono::steady_clock::now();
  Loaded L;
  L.world = &parallel_world(o.parallel);
  L.prompts = parse_prompt_ids(o.prompt_ids);
  if (L.world->size() > 1)
    check_same_on_all_ranks(*L.world,
                            {{"flags", fmt::format("--model {} --dtype {} --quantize {} --max-seq-len {} {} {}",
                                                   o.model_dir, o.dtype, o.quantize, o.max_seq_len,
                                                   o.parallel.flags_string(), extra_flags)},
                                       {"prompts", o.prompt_ids}});
  int64_t longest = 0;
  for (const auto& p : L.prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  ModelOptions mo;
  mo.dtype = parse_dtype(o.dtype);
  mo.quantize_w8a8 = o.quantize == "w8a8";
  mo.max_seq = o.max_seq_len > 0 ? o.max_seq_len : std::max<int64_t>(1, longest + max_new);
  mo.n_slots = static_cast<int64_t>((L.prompts.size() + o.parallel.par.dp - 1) / o.parallel.par.dp);
  mo.world = L.world;
  mo.par = o.parallel.par;
  mo.ep = o.parallel.ep_options();
  mo.count_experts = count_experts;
  L.model = Model::load(o.model_dir, mo);
  L.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return L;
}

// "1.00-1.35 (mean 1.12)": the max/mean expert load of each MoE layer, summarised.
std::string load_spread(const std::vector<std::vector<int64_t>>& load, std::vector<double>* per_layer) {
  double lo = 1e30, hi = 0, sum = 0;
  int n = 0;
  for (const auto& row : load) {
    if (row.empty()) continue;
    int64_t mx = 0, tot = 0;
    for (int64_t x : row) {
      mx = std::max(mx, x);
      tot += x;
    }
    const double spread = tot > 0 ? static_cast<double>(mx) * row.size() / tot : 0.0;
    per_layer->push_back(spread);
    lo = std::min(lo, spread);
    hi = std::max(hi, spread);
    sum += spread;
    ++n;
  }
  if (n == 0) return "no MoE layers";
  return fmt::format("max/mean {:.2f}-{:.2f} over {} MoE layers (mean {:.2f})", lo, hi, n, sum / n);
}

int run_forward(const CommonOpts& o, const std::string& out_path, bool quiet) {
  Loaded L = load(o, 0, false, "forward " + out_path);
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor logits = prefill_logits(*L.model, L.prompts);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (L.world->rank() == 0) {
    Tensor lengths = Tensor::empty({static_cast<int64_t>(L.prompts.size())}, DType::I64);
    for (size_t i = 0; i < L.prompts.size(); ++i) lengths.data<int64_t>()[i] = static_cast<int64_t>(L.prompts[i].size());
    write_safetensors(out_path, {{"logits", logits}, {"lengths", lengths}}, {{"producer", "moe-ep forward"}});
    if (!quiet)
      fmt::print("moe-ep forward: {} ({}), {} prompts, dtype {}, {} rank(s) ({}): loaded in {:.3f} s, ran in {:.3f} ms; "
                 "wrote {} logits {}\n",
                 L.model->config().model_type, L.model->config().summary(), L.prompts.size(), weights_desc(o),
                 L.world->size(), to_string(o.parallel.par), L.load_s, run_s * 1e3, out_path,
                 shape_str(logits.shape()));
  }
  return 0;
}

struct GenOpts {
  int64_t max_new_tokens = 16;
  double temperature = 0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false, quiet = false;
  std::string output_json;
};

int run_generate(const CommonOpts& o, const GenOpts& g) {
  GenerateOptions go;
  go.max_new_tokens = g.max_new_tokens;
  go.sampling.temperature = g.temperature;
  go.sampling.top_k = g.top_k;
  go.sampling.top_p = g.top_p;
  go.sampling.seed = g.seed;
  go.ignore_eos = g.ignore_eos;
  MOE_CHECK(g.max_new_tokens >= 1, "--max-new-tokens must be at least 1, got {}", g.max_new_tokens);
  MOE_CHECK(g.top_p > 0 && g.top_p <= 1, "--top-p must be in (0, 1], got {}", g.top_p);
  Loaded L = load(o, g.max_new_tokens, true,
                  fmt::format("generate {} {} {} {} {} {}", g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.seed,
                              g.ignore_eos));
  const GenerateResult r = generate(*L.model, L.prompts, go);
  if (L.world->rank() != 0) return 0;
  std::vector<double> spread;
  const std::string spread_s = load_spread(r.expert_load, &spread);
  const double pre_tps = r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0;
  const double dec_tps = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
  if (!g.quiet) {
    for (size_t i = 0; i < r.tokens.size(); ++i) fmt::print("prompt {}: {}\n", i, fmt::join(r.tokens[i], ","));
    fmt::print(
        "moe-ep generate: {} dtype {}, {} rank(s) ({}), {} prompts: prefill {} tokens in {:.2f} ms ({:.1f} tokens/s), "
        "decode {} tokens in {} steps, {:.2f} ms ({:.1f} tokens/s); expert load {}; loaded in {:.3f} s; threads {}\n",
        L.model->config().model_type, weights_desc(o), L.world->size(), to_string(o.parallel.par), L.prompts.size(),
        r.prefill_tokens, r.prefill_s * 1e3, pre_tps, r.decode_tokens, r.decode_steps, r.decode_s * 1e3, dec_tps,
        spread_s, L.load_s, num_threads());
  }
  if (!g.output_json.empty()) {
    nlohmann::json j;
    j["model_type"] = L.model->config().model_type;
    j["dtype"] = o.dtype;
    j["quantize"] = o.quantize;
    j["ranks"] = L.world->size();
    j["parallel"] = to_string(o.parallel.par);
    j["prompts"] = L.prompts;
    j["generated"] = r.tokens;
    j["timings"] = {{"load_s", L.load_s},
                    {"prefill_s", r.prefill_s},
                    {"prefill_tokens", r.prefill_tokens},
                    {"prefill_tokens_per_s", pre_tps},
                    {"decode_s", r.decode_s},
                    {"decode_tokens", r.decode_tokens},
                    {"decode_steps", r.decode_steps},
                    {"decode_tokens_per_s", dec_tps}};
    j["expert_load"] = r.expert_load;
    j["expert_load_max_over_mean"] = spread;
    std::ofstream out(g.output_json);
    MOE_CHECK(out.good(), "cannot write --output-json {}", g.output_json);
    out << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

Verb add_bench_model_verb(CLI::App& app);  // cli/bench_model.cpp

std::vector<Verb> add_model_verbs(CLI::App& app) {
  std::vector<Verb> verbs;
  {
    auto o = std::make_shared<CommonOpts>();
    auto out = std::make_shared<std::string>();
    auto quiet = std::make_shared<bool>(false);
    CLI::App* f = app.add_subcommand(
        "forward",
        "Run a batch of prompts through a whole model once (prefill) and write the logits of every position: "
        "'logits' [B, S_max, V] f32 (rows past a prompt's length are zero) and 'lengths' [B] i64");
    add_common(f, *o);
    f->add_option("--logits", *out, "safetensors file to write (rank 0 writes it)")->required();
    f->add_flag("--quiet", *quiet, "Print nothing on success");
    verbs.push_back({f, [o, out, quiet] { return run_forward(*o, *out, *quiet); }});
  }
  {
    auto o = std::make_shared<CommonOpts>();
    auto g = std::make_shared<GenOpts>();
    CLI::App* gc = app.add_subcommand(
        "generate",
        "Generate tokens for a batch of prompts: prefill, then decode with the KV cache until EOS or "
        "--max-new-tokens; prints the new ids of each prompt and a summary (prefill and decode tokens/s, expert "
        "load spread)");
    add_common(gc, *o);
    gc->add_option("--max-new-tokens", g->max_new_tokens, "Tokens to generate per prompt (fewer on EOS)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    gc->add_option("--temperature", g->temperature, "Sampling temperature; 0 = greedy (argmax)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    gc->add_option("--top-k", g->top_k, "Sample among the k most likely tokens (0: all)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    gc->add_option("--top-p", g->top_p, "Nucleus sampling: the smallest set of tokens with this much probability")
        ->capture_default_str();
    gc->add_option("--seed", g->seed,
                   "Sampling seed; the draw of request i at step s depends only on (seed, i, s), so the same seed "
                   "gives the same tokens on any parallel layout")
        ->capture_default_str();
    gc->add_flag("--ignore-eos", g->ignore_eos, "Keep generating after an EOS token (eos_token_id of the config)");
    gc->add_option("--output-json", g->output_json, "Write the prompts, generated ids, timings and expert load here");
    gc->add_flag("--quiet", g->quiet, "Print nothing (with --output-json: only the file)");
    verbs.push_back({gc, [o, g] { return run_generate(*o, *g); }});
  }
  verbs.push_back(add_bench_model_verb(app));
  return verbs;
}

}  // namespace moe
