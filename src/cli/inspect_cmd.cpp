// `moe-ep inspect`: what a checkpoint holds, whether it is complete, and what each
// rank of an --ep/--tp layout reads. Completeness and the plan come from the model's
// own list of reads (model/weights.h for embeddings, norms, lm_head and attention;
// loader/moe_weights.h for the MLP blocks), so every tensor the model would read is
// checked and every other one is unexpected. One process computes the plan for every
// rank; --load then really loads a rank's share (rank 0, or every rank in turn) and
// reports the time and GB/s next to the bytes the plan predicted.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <memory>

#include "core/atomic_file.h"
#include "cli/verbs.h"
#include "core/check.h"
#include "loader/checkpoint.h"
#include "loader/inventory.h"
#include "loader/moe_weights.h"
#include "loader/progress.h"
#include "loader/shard.h"
#include "model/registry.h"
#include "model/weights.h"
#include "moe/config.h"

namespace moe {

namespace {

struct InspectOptions {
  std::string model_dir;
  int ep = 1, tp = 1;
  int attn_tp = 1;  // --attn-tp: attention, KV, shared experts, dense MLPs and the vocabulary split over the EP group
  bool strict = false;
  bool load = false;
  bool all_ranks = false;
  bool no_pack = false;
  std::string dtype = "bf16";
  std::string json_path;
};

std::string gb(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}

struct LoadResult {
  int rank = 0;
  uint64_t bytes_touched = 0, planned = 0;
  double seconds = 0;
};

// Loads rank `p`'s share (loader/inventory.h load_share) on a fresh Checkpoint, so
// the bytes counted are this rank's alone.
LoadResult load_rank(const InspectOptions& o, const ModelConfig& c, const RankPlan& p, DType compute) {
  const auto t0 = std::chrono::steady_clock::now();
  Checkpoint ck = Checkpoint::open(o.model_dir);
  Progress progress(fmt::format("moe-ep inspect: loading rank {}", p.rank), p.non_expert_bytes + p.expert_bytes);
  MlpLoadOptions opt;
  opt.compute = compute;
  opt.expert_begin = p.expert_begin;
  opt.expert_end = p.expert_end;
  opt.tp_rank = p.tp_rank;
  opt.tp_size = o.tp;
  opt.mlp_tp_rank = o.attn_tp > 1 ? p.rank : 0;
  opt.mlp_tp_size = o.attn_tp;
  opt.strict = o.strict;
  opt.warn = [](const std::string&) {};  // reported once by the check above
  opt.progress = &progress;
  const std::vector<TensorRead> reads =
      o.attn_tp > 1 ? model_reads(c, p.rank, o.attn_tp, /*vocab_parallel=*/true) : model_reads(c, p.tp_rank, o.tp);
  load_share(ck, c.moe, reads, opt, !o.no_pack);
  progress.finish();
  LoadResult r;
  r.rank = p.rank;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.bytes_touched = ck.bytes_touched() + ck.header_bytes_opened();
  r.planned = p.read_bytes();
  return r;
}

int run_inspect(const InspectOptions& opts) {
  InspectOptions o = opts;
  if (o.attn_tp > 1 && o.ep == 1) o.ep = o.attn_tp;  // as the model verbs: --attn-tp N alone means --ep N
  Checkpoint ck = Checkpoint::open(o.model_dir);
  ModelConfig c;
  try {
    c = model_config_from_hf(ck.config());
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {}/config.json)", e.what(), o.model_dir));
  }
  apply_checkpoint_layout(ck, c);
  const MoeConfig& cfg = c.moe;
  const DType compute = parse_dtype(o.dtype);
  const Inventory inv = take_inventory(ck);
  // Every layer holds at least one tensor: a config claiming more is wrong (and the
  // per-layer loops below would run for ever).
  MOE_CHECK(static_cast<uint64_t>(cfg.n_layers) <= static_cast<uint64_t>(inv.n_tensors),
            "{}/config.json: num_hidden_layers={} but the checkpoint holds only {} tensors", o.model_dir,
            cfg.n_layers, inv.n_tensors);
  const std::vector<TensorProblem> problems = check_checkpoint(ck, cfg, model_reads(c, 0, 1));
  size_t n_errors = 0, n_unexpected = 0;
  for (const auto& p : problems) (p.kind == TensorProblem::Unexpected ? n_unexpected : n_errors)++;
  // The plan enumerates experts: only once the routers have proved E against the file.
  const std::vector<RankPlan> plans =
      n_errors == 0 ? read_plan(
                          ck, cfg, inv, o.ep, o.tp, compute,
                          [&](int rank, int n) { return model_reads(c, rank, n, /*vocab_parallel=*/o.attn_tp > 1); },
                          o.attn_tp)
                    : std::vector<RankPlan>{};

  int64_t n_moe = 0;
  std::string moe_layers;
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    if (cfg.is_moe_layer(l)) {
      ++n_moe;
      if (moe_layers.size() < 60) moe_layers += (moe_layers.empty() ? "" : ",") + std::to_string(l);
    }
  fmt::print("moe-ep inspect: {}\n", o.model_dir);
  fmt::print("  model:   {}\n", c.summary());
  fmt::print("  experts: {}\n", cfg.summary());
  fmt::print("  layers:  {} ({} MoE: {}{}; {} dense)\n", cfg.n_layers, n_moe, moe_layers,
             moe_layers.size() >= 60 ? ",..." : "", cfg.n_layers - n_moe);
  fmt::print("  files:   {} file{}, {} ({} of headers), {} tensors, {} of tensor data\n", inv.n_files,
             inv.n_files == 1 ? "" : "s", gb(inv.file_bytes), gb(inv.header_bytes), inv.n_tensors,
             gb(inv.tensor_bytes));
  fmt::print("  tensors by kind:\n    {:<16} {:>8} {:>14} {:>7}\n", "kind", "count", "bytes", "share");
  for (const auto& [kind, t] : inv.kinds)
    fmt::print("    {:<16} {:>8} {:>14} {:>6.1f}%\n", tensor_kind_name(kind), t.count, gb(t.bytes),
               inv.tensor_bytes ? 100.0 * t.bytes / inv.tensor_bytes : 0.0);
  if (o.attn_tp > 1)
    fmt::print("  read plan for --ep {} --attn-tp {} ({} rank{}; attention heads, shared experts, dense MLPs and the "
               "vocabulary (embedding and lm_head rows) split over the {} ranks, routed experts whole on their EP "
               "rank, routers whole; experts at --dtype {} in memory, int4 ones (GPTQ, AWQ, compressed-tensors) in "
               "int4, GGUF quantised ones in their codes):\n",
               o.ep, o.attn_tp, plans.size(), plans.size() == 1 ? "" : "s", o.attn_tp, dtype_name(compute));
  else
    fmt::print("  read plan for --ep {} --tp {} ({} rank{}; attention heads and each expert's I split over --tp, the "
               "other non-expert tensors replicated; experts at --dtype {} in memory, int4 ones (GPTQ, AWQ, "
               "compressed-tensors) in int4, GGUF quantised ones in their codes):\n",
               o.ep, o.tp, plans.size(), plans.size() == 1 ? "" : "s", dtype_name(compute));
  fmt::print("    {:>4} {:>3} {:>3} {:>12} {:>12} {:>12} {:>12} {:>7} {:>14}\n", "rank", "ep", "tp", "experts",
             "non-expert", "experts", "read", "of file", "expert memory");
  const size_t shown = std::min<size_t>(plans.size(), 16);
  for (size_t i = 0; i < shown; ++i) {
    const RankPlan& p = plans[i];
    fmt::print("    {:>4} {:>3} {:>3} {:>12} {:>12} {:>12} {:>12} {:>6.1f}% {:>14}\n", p.rank, p.ep_rank, p.tp_rank,
               fmt::format("[{},{})", p.expert_begin, p.expert_end), gb(p.non_expert_bytes), gb(p.expert_bytes),
               gb(p.read_bytes()), inv.file_bytes ? 100.0 * p.read_bytes() / inv.file_bytes : 0.0,
               gb(p.resident_expert_bytes));
  }
  if (shown < plans.size()) fmt::print("    ... ({} ranks in all)\n", plans.size());

  if (plans.empty()) fmt::print("    (not computed: the checkpoint has missing or mis-shaped tensors)\n");
  if (problems.empty()) {
    fmt::print("  problems: none (every tensor the model reads present with the expected shape and dtype; nothing "
               "unexpected)\n");
  } else {
    fmt::print("  problems: {} missing/mis-shaped, {} unexpected{}\n", n_errors, n_unexpected,
               n_unexpected && !o.strict ? " (warnings; --strict makes them errors)" : "");
    for (const auto& p : problems)
      fmt::print("    {}: {}\n", p.kind == TensorProblem::Unexpected ? (o.strict ? "error" : "warning") : "error",
                 p.message);
  }

  std::vector<LoadResult> loads;
  const bool ok = n_errors == 0 && (n_unexpected == 0 || !o.strict);
  if (o.load && ok) {
    for (size_t i = 0; i < (o.all_ranks ? plans.size() : 1); ++i) {
      loads.push_back(load_rank(o, c, plans[i], compute));
      const LoadResult& r = loads.back();
      fmt::print("  load rank {}{}: read {} (plan {}) in {:.3f} s: {:.2f} GB/s\n", r.rank,
                 o.no_pack ? " (no packing)" : "", gb(r.bytes_touched),
                 gb(r.planned), r.seconds, r.seconds > 0 ? r.bytes_touched / r.seconds / 1e9 : 0.0);
    }
  }

  if (!o.json_path.empty()) {
    nlohmann::ordered_json j;
    j["model_dir"] = o.model_dir;
    j["model_type"] = c.model_type;
    j["summary"] = c.summary();
    j["hyperparameters"] = {{"hidden_size", cfg.hidden_size},         {"num_layers", cfg.n_layers},
                            {"vocab_size", c.vocab_size},            {"attention_heads", c.n_heads},
                            {"kv_heads", c.n_kv_heads},               {"head_dim", c.head_dim},
                            {"n_experts", cfg.n_experts},             {"top_k", cfg.top_k},
                            {"moe_intermediate_size", cfg.moe_intermediate_size},
                            {"shared_intermediate_size", cfg.shared_intermediate_size},
                            {"dense_intermediate_size", cfg.dense_intermediate_size}, {"moe_layers", n_moe}};
    j["files"] = {{"count", inv.n_files}, {"bytes", inv.file_bytes}, {"header_bytes", inv.header_bytes},
                  {"tensors", inv.n_tensors}, {"tensor_bytes", inv.tensor_bytes}};
    auto& kinds = j["kinds"] = nlohmann::ordered_json::object();
    for (const auto& [kind, t] : inv.kinds) kinds[tensor_kind_name(kind)] = {{"count", t.count}, {"bytes", t.bytes}};
    j["layout"] = {{"ep", o.ep}, {"tp", o.tp}, {"attn_tp", o.attn_tp}, {"dtype", dtype_name(compute)}};
    auto& pj = j["ranks"] = nlohmann::ordered_json::array();
    for (const RankPlan& p : plans)
      pj.push_back({{"rank", p.rank}, {"ep_rank", p.ep_rank}, {"tp_rank", p.tp_rank},
                    {"experts", {p.expert_begin, p.expert_end}}, {"non_expert_bytes", p.non_expert_bytes},
                    {"expert_bytes", p.expert_bytes}, {"header_bytes", p.header_bytes},
                    {"read_bytes", p.read_bytes()}, {"resident_expert_bytes", p.resident_expert_bytes}});
    auto& prj = j["problems"] = nlohmann::ordered_json::array();
    for (const auto& p : problems)
      prj.push_back({{"kind", p.kind == TensorProblem::Missing      ? "missing"
                              : p.kind == TensorProblem::WrongShape ? "shape"
                              : p.kind == TensorProblem::WrongDType ? "dtype"
                                                                    : "unexpected"},
                     {"key", p.key}, {"message", p.message}});
    auto& lj = j["loads"] = nlohmann::ordered_json::array();
    for (const auto& r : loads)
      lj.push_back({{"rank", r.rank}, {"bytes_read", r.bytes_touched}, {"planned_bytes", r.planned},
                    {"seconds", r.seconds}, {"gb_per_s", r.seconds > 0 ? r.bytes_touched / r.seconds / 1e9 : 0.0}});
    write_file_atomic(o.json_path, j.dump(2) + "\n", "--json");
  }

  MOE_CHECK(n_errors == 0, "{}: {} missing or mis-shaped tensor{} (listed above); first: {}", o.model_dir, n_errors,
            n_errors == 1 ? "" : "s", [&] {
              for (const auto& p : problems)
                if (p.kind != TensorProblem::Unexpected) return p.message;
              return std::string();
            }());
  MOE_CHECK(n_unexpected == 0 || !o.strict, "{}: {} unexpected tensor{} (--strict); first: {}", o.model_dir,
            n_unexpected, n_unexpected == 1 ? "" : "s", problems.front().message);
  return 0;
}

}  // namespace

std::vector<Verb> add_inspect_verbs(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* c = app.add_subcommand(
      "inspect",
      "Inventory of a Hugging Face MoE checkpoint: family and hyperparameters, tensors by kind, the bytes each rank "
      "of an --ep/--tp layout reads, and every missing or unexpected tensor (exit 1 if any is missing)");
  c->add_option("--model", o->model_dir, "Model: a directory (config.json and *.safetensors) or a GGUF file "
                  "(llama.cpp's format; qwen3moe, qwen2moe or Mixtral; the first part of a split model)")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--ep", o->ep, "Expert-parallel size to plan for (no mpirun needed)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  c->add_option("--tp", o->tp,
                "Tensor-parallel size to plan for (splits the attention heads and each expert's I, as the model "
                "verbs' --tp does)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  c->add_option("--attn-tp", o->attn_tp,
                "Attention-TP size to plan for over the EP group (the model verbs' --attn-tp: heads, KV, shared "
                "experts, dense MLPs and the vocabulary split N ways; sets --ep N when --ep is not given)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  c->add_flag("--strict", o->strict, "Unexpected tensors (keys the model does not read) are errors");
  c->add_flag("--load", o->load,
              "Also load rank 0's share of every weight as the model does and report the bytes read against the "
              "plan, the time and GB/s");
  c->add_flag("--all-ranks", o->all_ranks, "With --load: load every rank's share in turn");
  c->add_flag("--no-pack", o->no_pack,
              "With --load: read and copy each tensor's slice into memory but skip packing the experts into the "
              "kernels' layout (measures the I/O path alone)");
  c->add_option("--dtype", o->dtype, "Compute dtype of the loaded expert weights: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  c->add_option("--json", o->json_path, "Also write the report as JSON to this file");
  return {{c, [o] { return run_inspect(*o); }}};
}

}  // namespace moe
