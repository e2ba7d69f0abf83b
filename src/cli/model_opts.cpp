#include "cli/model_opts.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/consistency.h"
#include "loader/checkpoint.h"
#include "core/check.h"
#include "runtime/runner.h"

namespace moe {

std::string weights_desc(const CommonOpts& o) {
  std::string d = o.quantize == "none" ? o.dtype : fmt::format("{} (routed experts {})", o.dtype, o.quantize);
  if (o.quantize_linears != "none") d += fmt::format(" (attention and lm_head {})", o.quantize_linears);
  if (o.kv_cache_dtype != "f32") d += fmt::format(" (KV cache {})", o.kv_cache_dtype);
  return d;
}

void add_kv_cache_dtype_option(CLI::App* cmd, std::string& dtype) {
  // Per token, K + V of every layer: Qwen3-30B-A3B 48 layers x 2 x 4 heads x 128 =
  // 49152 values, DeepSeek-V3 61 layers x (512 + 64) = 35136 (config.json of each).
  cmd->add_option("--kv-cache-dtype", dtype,
                  "Element type of the KV cache: f32 (exactly what the projections computed), or bf16 (each value "
                  "rounded to the nearest bf16 when stored, widened exactly when read; logits within bf16 "
                  "tolerance of the f32 cache): half the memory and half the bytes every decode step reads at long "
                  "context. Per token of context: Qwen3-30B-A3B 192 KiB in f32, 96 KiB in bf16 (6 vs 3 GiB for a "
                  "32768-token sequence); DeepSeek-V3 (MLA latent) 137 vs 69 KiB")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
}

void add_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--dtype", dtype,
                  "Compute dtype of the weights: auto (the checkpoint's own, from config.json's torch_dtype: bf16 "
                  "for bfloat16/float16 and quantised checkpoints, whose FP8 codes stay in memory; f32 for float32), "
                  "f32, or bf16 (bf16 weights and GEMM inputs, f32 activations and accumulation)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
}

void resolve_auto_dtype(CommonOpts& o) {
  if (o.dtype != "auto") return;
  // The checkpoint's own reading of config.json (lazy: no shard is mapped here), so a
  // missing or broken file fails with the message the load itself gives.
  const Checkpoint ck = Checkpoint::open(o.model_dir);
  const nlohmann::json& c = ck.config();
  o.dtype = "f32";
  if (c.contains("quantization_config")) {
    o.dtype = "bf16";
    return;
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    const auto it = c.find(key);
    if (it == c.end() || !it->is_string()) continue;
    const std::string t = it->get<std::string>();
    if (t == "bfloat16" || t == "float16" || t == "bf16" || t == "fp16" || t == "half") o.dtype = "bf16";
    return;
  }
}

void add_weights_cache_option(CLI::App* cmd, std::string& dir) {
  cmd->add_option("--weights-cache", dir,
                  "Directory for packed-weight cache files (created if missing). The first start packs the "
                  "weights as usual and writes this rank's packed tensors there (about their packed size: 1.04x a "
                  "Q4_0 GGUF, 1.09x a Q4_K_M one); later starts with the same model files, options, parallel layout "
                  "and rank map that file instead of repacking (a 1.5 GB Q4_0 GGUF: 1.3 s to pack, 0.16 s to map on "
                  "a 2-vCPU AVX-512 Xeon, the file in the page cache; `cat` reads it in 0.16-0.22 s). A stale file "
                  "(the model's files, the moe-ep build, the ISA level or the options changed) or a damaged one is "
                  "rebuilt, never trusted. Off by default: it costs disk space of the packed weights")
      ->type_name("DIR");
}

namespace {

// An option value "@PATH" becomes the contents of PATH (trailing white space dropped);
// any other value is kept.
// (CLI11 puts the option's name before the message of a failure.)
std::function<std::string(std::string)> read_at_file() {
  return [](std::string v) {
    if (v.empty() || v[0] != '@') return v;
    const std::string path = v.substr(1);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw CLI::ValidationError("cannot read '" + path + "' (" + std::strerror(errno) + ")");
    std::ostringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    s.erase(s.find_last_not_of(" \t\r\n") + 1);
    return s;
  };
}

}  // namespace

void add_common(CLI::App* cmd, CommonOpts& o) {
  cmd->add_option("--model", o.model_dir, "Model: a Hugging Face directory (config.json and *.safetensors) or a GGUF file "
                  "(llama.cpp's format; qwen3moe, qwen2moe or Mixtral; the first part of a split model)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--prompt-ids", o.prompt_ids,
                  "Prompts as token ids: ids separated by ',', prompts by ';' (e.g. \"1,2,3;4,5\"); all prompts run "
                  "as one batch. @FILE reads them from FILE, in the same form (for long prompts: one command-line "
                  "argument holds at most 128 KiB on Linux, some 20k ids)")
      ->transform(read_at_file(), "", "");
  add_dtype_option(cmd, o.dtype);
  cmd->add_option("--quantize", o.quantize,
                  "Quantise the routed experts at load: w8a8 = SmoothQuant int8 weights (per-output-channel scales "
                  "absmax/127, smooth = 1) and per-token dynamic int8 activations; the router stays f32, and the "
                  "shared experts, dense MLP layers, attention and lm_head stay in --dtype. With --moe-comm alltoall "
                  "or alltoall-ll the tokens travel as int8 rows and the logits equal the one-rank W8A8 logits bit for "
                  "bit; under --tp each rank quantises its slice of the intermediate dimension (W2 scales and GEMM2 "
                  "activation scales over that slice), so the logits are close to, not equal to, one rank's. "
                  "w4a8 = 4-bit weights with a scale and zero point per --int4-group input values of each output "
                  "channel, and the same int8 activations (and dispatch rows) as w8a8. none: the experts as the "
                  "checkpoint stores them (a GGUF's quantised experts keep their codes, exactly: Q4_0, Q4_1 and Q4_K "
                  "in 4 bits, Q5_0, Q5_1, Q5_K and Q6_K in 6, Q8_0 in 8, with the file's scales and int8 activations)")
      ->check(CLI::IsMember({"none", "w8a8", "w4a8"}))
      ->capture_default_str();
  cmd->add_option("--int4-group", o.int4_group,
                  "With --quantize w4a8 or --quantize-linears w4a8: input values per weight group (32, 64 or 128). "
                  "32 (the default) is the "
                  "most accurate for this round-to-nearest quantiser (no calibration); 128 reads 18% fewer bytes "
                  "(0.54 instead of 0.66 bytes per weight, f32 scales and zero points included). See "
                  "docs/PERF_QUANT.md")
      ->check(CLI::IsMember({int64_t{32}, int64_t{64}, int64_t{128}}))
      ->capture_default_str();
  cmd->add_option("--quantize-linears", o.quantize_linears,
                  "Quantise the attention projections (q/k/v/o; MLA q_a/q_b/kv_a/o) and lm_head at load: w8a8 = "
                  "int8 weights with per-output-channel scales (absmax/127) and per-token dynamic int8 inputs, as "
                  "--quantize w8a8 does for the experts; w4a8 = 4-bit weights with a scale and zero point per "
                  "--int4-group inputs (0.66 byte per weight at 32 against int8's 1.0: fewer bytes per decode step, "
                  "a slower GEMM at prefill) and the same int8 inputs. Attention and lm_head are half the bytes a decode step "
                  "reads in a 4-layer Qwen3-30B-A3B-shaped model, so with quantised experts they set the pace. The "
                  "attention itself (scores, softmax, KV cache), norms, router and embedding stay f32/--dtype. none: "
                  "as stored (a GGUF's quantised linears keep their codes, exactly, as its experts do: fewer bytes "
                  "per decode step than int8 for the 4-bit types, a slower GEMM at prefill)")
      ->check(CLI::IsMember({"none", "w8a8", "w4a8"}))
      ->capture_default_str();
  cmd->add_option("--max-seq-len", o.max_seq_len,
                  "Positions per sequence in the KV cache, allocated up front (default: the longest prompt plus "
                  "--max-new-tokens); a request that does not fit is an error")
      ->check(CLI::NonNegativeNumber);
  add_kv_cache_dtype_option(cmd, o.kv_cache_dtype);
  add_weights_cache_option(cmd, o.weights_cache);
  add_model_parallel_options(cmd, o.parallel);
}

Loaded load(const CommonOpts& o, int64_t max_new, bool count_experts, const std::string& extra_flags,
            std::vector<std::vector<int32_t>> prompts, const std::function<void(ModelOptions&)>& tweak) {
  const auto t0 = std::chrono::steady_clock::now();
  Loaded L;
  L.world = &parallel_world(o.parallel);
  L.prompts = prompts.empty() && !o.prompt_ids.empty() ? parse_prompt_ids(o.prompt_ids) : std::move(prompts);
  if (L.world->size() > 1) {
    std::string ids;
    for (const auto& p : L.prompts) ids += fmt::format("{};", fmt::join(p, ","));
    check_same_on_all_ranks(*L.world,
                            {{"flags", fmt::format("--model {} --dtype {} --quantize {} --int4-group {} --quantize-linears {} "
                                                   "--max-seq-len {} --kv-cache-dtype {} {} {}",
                                                   o.model_dir, o.dtype, o.quantize, o.int4_group, o.quantize_linears,
                                                   o.max_seq_len, o.kv_cache_dtype,
                                                   o.parallel.flags_string(), extra_flags)},
                                       {"prompts", ids}});
  }
  int64_t longest = 0;
  for (const auto& p : L.prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  ModelOptions mo;
  MOE_CHECK(o.dtype != "auto", "internal: --dtype auto not resolved before load (resolve_auto_dtype)");
  mo.dtype = parse_dtype(o.dtype);
  mo.quantize_w8a8 = o.quantize == "w8a8";
  mo.quantize_w4a8 = o.quantize == "w4a8";
  mo.int4_group = o.int4_group;
  mo.quantize_linears = o.quantize_linears == "w8a8";
  mo.quantize_linears_w4a8 = o.quantize_linears == "w4a8";
  mo.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  mo.max_seq = o.max_seq_len > 0 ? o.max_seq_len : std::max<int64_t>(1, longest + max_new);
  mo.n_slots = static_cast<int64_t>((L.prompts.size() + o.parallel.par.dp - 1) / o.parallel.par.dp);
  mo.world = L.world;
  mo.par = o.parallel.par;
  mo.ep = o.parallel.ep_options();
  mo.eplb = o.parallel.eplb;
  if (L.world->rank() == 0) mo.eplb.log = [](const std::string& s) { fmt::print(stderr, "{}\n", s); };
  mo.count_experts = count_experts;
  mo.weights_cache_dir = o.weights_cache;
  if (tweak) tweak(mo);
  L.model = Model::load(o.model_dir, mo);
  L.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return L;
}

}  // namespace moe
