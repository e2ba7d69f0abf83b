#include "cli/layer_cmd.h"

#include <fmt/core.h>

#include <chrono>

#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/config.h"
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

}  // namespace

void run_layer_cmd(const LayerCmdOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
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

  std::optional<MoeLayer> moe_layer;
  std::optional<GatedMlpWeights> dense;
  if (is_moe) {
    MlpLoadOptions lo;
    lo.compute = opt.dtype;
    moe_layer.emplace(cfg, load_moe_layer(ck, cfg, opt.layer, lo));
  } else {
    dense = load_dense_mlp(ck, cfg, opt.layer, opt.dtype);
  }
  const double load_s = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Tensor y;
  if (is_moe) {
    y = moe_layer->forward(x);
  } else {
    y = Tensor::zeros({T, H}, DType::F32);
    MoeScratch scratch;
    run_gated_mlp(*dense, x, y.data<float>(), scratch);
  }
  const double run_s = seconds_since(t1);
  write_safetensors(opt.output, {{"hidden_states", y}}, {{"producer", "moe-ep layer"}});
  if (!opt.quiet) {
    fmt::print(
               "moe-ep layer: {} layer {} ({}), {} tokens, dtype {}: loaded in {:.3f} s, ran in {:.3f} ms; "
               "wrote {} [{}, {}] f32\n  cpu: {}, threads: {}\n",
               cfg.model_type, opt.layer, is_moe ? "MoE" : "dense MLP", T, dtype_name(opt.dtype), load_s,
               run_s * 1e3, opt.output, T, H, cpu_summary(), num_threads());
  }
}

}  // namespace moe
