#include "cli/layer_cmd.h"

#include "cli/verbs.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <fmt/core.h>

#include <chrono>
#include <memory>
#include <optional>

#include "comm/consistency.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/config.h"
#include "moe/ep_layer.h"
#include "moe/placement_file.h"
#include "moe/slot_weights.h"
#include "moe/fused_moe.h"

namespace moe {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Tensor read_hidden_states(const std::string& path, int64_t hidden) {
  auto file = SafetensorsFile::open(path);
  MOE_CHECK(file->find("hidden_states"), "input {} has no tensor 'hidden_states' (expected [T, {}] f32 or bf16)",
            path, hidden);
  Tensor x = file->view("hidden_states");
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == hidden,
            "input {}: 'hidden_states' has shape {}, expected [T, {}] (T tokens, hidden_size {})", path,
            shape_str(x.shape()), hidden, hidden);
  MOE_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16 || x.dtype() == DType::F16,
            "input {}: 'hidden_states' has dtype {}, expected f32, bf16 or f16", path, dtype_name(x.dtype()));
  // f16 has no kernel path of its own; bf16 and f32 are passed through as they are.
  return x.dtype() == DType::F16 ? x.to(DType::F32) : x.clone();
}

// Rank 0 receives every rank's rows of y, in rank order (shares are contiguous and ordered).
Tensor gather_rows(Communicator& comm, const Tensor& y_local, int64_t T, int64_t H) {
  const int R = comm.size();
  std::vector<size_t> bytes(R);
  const size_t mine = y_local.nbytes();
  std::vector<size_t> all(R);
  comm.all_gather(&mine, sizeof mine, all.data());
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  comm.all_gather_v(y_local.raw(), mine, y.raw(), all);
  return y;
}

}  // namespace

void run_layer_cmd(const LayerCmdOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const ParallelOptions& po = opt.parallel;
  Communicator& world = parallel_world(po);
  const int R = world.size(), rank = world.rank();

  Checkpoint ck = Checkpoint::open(opt.model_dir);
  MoeConfig cfg;
  try {
    cfg = MoeConfig::from_hf(ck.config());
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {}/config.json)", e.what(), opt.model_dir));
  }
  MOE_CHECK(opt.layer >= 0 && opt.layer < cfg.n_layers, "--layer {} out of range: the model has {} layers (0..{})",
            opt.layer, cfg.n_layers, cfg.n_layers - 1);
  const Tensor x = read_hidden_states(opt.input, cfg.hidden_size);
  const int64_t T = x.dim(0), H = cfg.hidden_size;
  const bool is_moe = cfg.is_moe_layer(opt.layer);

  Tensor y;
  double load_s = 0, run_s = 0;
  std::string how = "1 rank";
  if (R == 1) {
    MOE_CHECK(!po.eplb.any(), "--redundant-experts, --placement and --eplb-interval need --ep > 1");
    std::optional<MoeLayer> moe_layer;
    std::optional<GatedMlpWeights> dense;
    MlpLoadOptions lo;
    lo.compute = opt.dtype;
    lo.strict = opt.strict;
    lo.quantize_w8a8 = opt.w8a8;
    if (is_moe) {
      moe_layer.emplace(cfg, load_moe_layer(ck, cfg, opt.layer, lo));
    } else {
      dense = load_dense_mlp(ck, cfg, opt.layer, lo);
    }
    load_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    const int64_t chunk = po.chunk_tokens;
    if (is_moe && chunk > 0 && T > chunk) {
      // --moe-chunk-tokens on one rank: calls of at most `chunk` rows bound the scratch.
      y = Tensor::zeros({T, H}, DType::F32);
      for (int64_t b = 0; b < T; b += chunk)
        moe_layer->forward(x.slice_rows(b, std::min(T, b + chunk)), y.data<float>() + b * H);
      how = fmt::format("1 rank, {} chunks of <= {} tokens", (T + chunk - 1) / chunk, chunk);
    } else if (is_moe) {
      y = moe_layer->forward(x);
    } else {
      y = Tensor::zeros({T, H}, DType::F32);
      MoeScratch scratch;
      run_gated_mlp(*dense, x, y.data<float>(), scratch);
    }
    run_s = seconds_since(t1);
  } else {
    MOE_CHECK(is_moe, "layer {} is a dense MLP: run it on one rank (expert parallelism applies to MoE layers)",
              opt.layer);
    MOE_CHECK(po.eplb.interval == 0, "--eplb-interval rebalances between the steps of generate and serve; `layer` "
                                      "runs one call (give it --placement or --redundant-experts)");
    const PlacementSource placements(po.eplb, cfg.n_experts, po.par.ep, po.par.tp,
                                     static_cast<int>(cfg.routing.n_group), &world);
    const Placement placement = placements.layer(opt.layer);
    check_same_on_all_ranks(world, {{"config.json", ck.config().dump()},
                                    {"flags", fmt::format("--layer {} --dtype {}{} {}", opt.layer, dtype_name(opt.dtype),
                                                          opt.w8a8 ? " --quantize w8a8" : "", po.flags_string())},
                                    {"placement", placement.describe()},
                                    {"input", fmt::format("{} {}", opt.input, shape_str(x.shape()))}});
    ParallelGroups groups(world, po.par);
    MlpLoadOptions lo;
    lo.compute = opt.dtype;
    lo.tp_rank = groups.tp_rank();
    lo.tp_size = po.par.tp;
    lo.strict = opt.strict;
    lo.quantize_w8a8 = opt.w8a8;
    if (rank != 0) lo.warn = [](const std::string&) {};  // warn once, not once per rank
    EpOptions eo = po.ep_options();
    MoeLayerWeights w = load_slot_weights(placement, groups.ep_rank(), [&](int64_t b, int64_t e) {
      lo.expert_begin = b;
      lo.expert_end = e;
      return load_moe_layer(ck, cfg, opt.layer, lo);
    });
    EpMoeLayer ep(MoeLayer(cfg, std::move(w)), world, placement, eo);
    load_s = seconds_since(t0);

    const bool replicated = eo.comm == MoeComm::AllReduce;
    const auto shares = token_shares(T, R, po.par.dp, replicated, opt.dp_tokens);
    const Tensor x_local = x.slice_rows(shares[rank].first, shares[rank].first + shares[rank].second).clone();
    world.barrier();
    const auto t1 = std::chrono::steady_clock::now();
    Tensor y_local = ep.forward(x_local);
    run_s = seconds_since(t1);
    y = replicated ? y_local : gather_rows(world, y_local, T, H);
    how = fmt::format("{} ranks ({}, moe-comm {}, {} round{})", R, to_string(po.par), moe_comm_name(ep.stats().used),
                      ep.stats().rounds, ep.stats().rounds == 1 ? "" : "s");
  }
  if (rank == 0) {
    write_safetensors(opt.output, {{"hidden_states", y}}, {{"producer", "moe-ep layer"}});
    if (!opt.quiet)
      fmt::print(
          "moe-ep layer: {} layer {} ({}), {} tokens, dtype {}{}, {}: loaded in {:.3f} s, ran in {:.3f} ms; "
          "wrote {} [{}, {}] f32\n  cpu: {}, threads: {}\n",
          cfg.model_type, opt.layer, is_moe ? "MoE" : "dense MLP", T, dtype_name(opt.dtype),
          opt.w8a8 && is_moe ? " (routed experts w8a8)" : "", how, load_s,
          run_s * 1e3, opt.output, T, H, cpu_summary(), num_threads());
  }
}

Verb add_layer_verb(CLI::App& app) {
  auto opt = std::make_shared<LayerCmdOptions>();
  auto dtype = std::make_shared<std::string>("f32");
  CLI::App* lc = app.add_subcommand(
      "layer",
      "Run the MLP block (MoE or dense) of one decoder layer of a Hugging Face model on the tensor "
      "'hidden_states' [T, H] of --input, and write 'hidden_states' [T, H] f32 to --output");
  lc->add_option("--model", opt->model_dir, "Model: a directory (config.json and *.safetensors) or a GGUF file "
                  "(llama.cpp's format; qwen3moe, qwen2moe or Mixtral; the first part of a split model)")
      ->required()
      ->check(CLI::ExistingPath);
  lc->add_option("--layer", opt->layer, "Decoder layer index (0-based)")->required();
  lc->add_option("--input", opt->input, "safetensors file holding 'hidden_states' [T, H] (f32, bf16 or f16)")
      ->required()
      ->check(CLI::ExistingFile);
  lc->add_option("--output", opt->output, "safetensors file to write ('hidden_states' [T, H] f32; rank 0 writes it)")
      ->required();
  lc->add_option("--dtype", *dtype,
                 "Compute dtype of the weights: f32, or bf16 (bf16 weights and activations, f32 accumulation)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  lc->add_flag("--quiet", opt->quiet, "Print nothing on success");
  auto quantize = std::make_shared<std::string>("none");
  lc->add_option("--quantize", *quantize,
                 "Quantise the routed experts at load: w8a8 = SmoothQuant int8 weights (per-output-channel "
                 "scales absmax/127, smooth = 1) and per-token dynamic int8 activations; the router and the "
                 "shared experts stay in --dtype")
      ->check(CLI::IsMember({"none", "w8a8"}))
      ->capture_default_str();
  lc->add_flag("--strict", opt->strict,
               "Unexpected tensors in the layer's MLP block (keys the family's name map does not use) are errors, "
               "not warnings");
  lc->add_option("--dp-tokens", opt->dp_tokens,
                 "Rows of the input per DP replica, comma separated (uneven counts and zeros allowed; "
                 "default: an even split)")
      ->delimiter(',');
  add_parallel_options(lc, opt->parallel);
  return {lc, [opt, dtype, quantize] {
            opt->dtype = parse_dtype(*dtype);
            opt->w8a8 = *quantize == "w8a8";
            run_layer_cmd(*opt);
            return 0;
          }};
}

}  // namespace moe
