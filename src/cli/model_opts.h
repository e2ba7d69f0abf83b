// The model flags shared by the verbs that load a whole model (forward, generate,
// chat, serve; bench-model has its own copies) and the load itself, with the
// cross-rank consistency check.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/parallel_opts.h"
#include "model/model.h"

namespace CLI {
class App;
}

namespace moe {

struct CommonOpts {
  // dtype: "auto" (the checkpoint's own: resolve_auto_dtype), "f32" or "bf16".
  std::string model_dir, prompt_ids, dtype = "auto", quantize = "none";
  int64_t int4_group = 32;  // --int4-group, with --quantize w4a8
  std::string quantize_linears = "none";  // --quantize-linears: none, w8a8 or w4a8
  int64_t max_seq_len = 0;
  std::string kv_cache_dtype = "bf16";  // --kv-cache-dtype: f32 or bf16 (KvCacheShape::dtype)
  std::string weights_cache;  // --weights-cache DIR (ModelOptions::weights_cache_dir); empty: none
  ParallelOptions parallel;
};

// "bf16" or "bf16 (routed experts w8a8)", for the summaries.
std::string weights_desc(const CommonOpts& o);

// --kv-cache-dtype f32|bf16 into `dtype` (model_opts, serve and bench-model share it).
void add_kv_cache_dtype_option(CLI::App* cmd, std::string& dtype);

// --dtype auto|f32|bf16 into `dtype` (model_opts and serve share it).
void add_dtype_option(CLI::App* cmd, std::string& dtype);

// Replaces --dtype auto by the checkpoint's own compute dtype, from its config.json:
// bf16 for bfloat16 or float16 weights (float16 rounded to bf16: moe-ep has no f16
// compute; --dtype f32 keeps them exact) and for quantised checkpoints (FP8 codes are
// kept and dequantised to bf16 in the GEMM; int8/int4 run beside bf16 float parts);
// f32 for float32 weights or a config that names no dtype. Every rank reads the same
// file, so every rank resolves the same. Call before load().
void resolve_auto_dtype(CommonOpts& o);

// --model, --prompt-ids, --dtype, --quantize, --max-seq-len, --kv-cache-dtype and the parallel flags.
// --weights-cache DIR (generate, forward, chat, serve).
void add_weights_cache_option(CLI::App* cmd, std::string& dir);
void add_common(CLI::App* cmd, CommonOpts& o);

struct Loaded {
  Communicator* world = nullptr;
  std::unique_ptr<Model> model;
  std::vector<std::vector<int32_t>> prompts;
  double load_s = 0;
};

// Loads the model of `o` on every rank (after checking that every rank has the same
// flags and prompts). prompts: the batch as ids (from --prompt-ids when empty); the KV
// cache gets one slot per prompt and replica, sized for the longest prompt + max_new
// unless --max-seq-len; `tweak` may change the model options last (serve, chat).
Loaded load(const CommonOpts& o, int64_t max_new, bool count_experts, const std::string& extra_flags,
            std::vector<std::vector<int32_t>> prompts = {}, const std::function<void(ModelOptions&)>& tweak = {});

}  // namespace moe
