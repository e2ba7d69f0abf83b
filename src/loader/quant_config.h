// config.json's `quantization_config`: which quantisation the checkpoint's authors
// applied, read once and checked, so that every loader agrees on it.
//
// Known methods:
//   absent         the weights are what their dtypes say (f32 / bf16 / f16; an
//                  F8_E4M3 tensor with "<key>_scale_inv" still loads as block-scaled
//                  FP8 with DeepSeek-V3's 128 x 128 blocks: some re-uploads drop the
//                  config block but keep the tensors)
//   "fp8"          Hugging Face's fine-grained FP8, as DeepSeek-V3/R1 and Qwen3-*-FP8
//                  publish it: e4m3 weights, one f32/bf16 "weight_scale_inv" per
//                  weight_block_size [rows, cols] block (default [128, 128]), dynamic
//                  activations (the engine computes activations in bf16: weight-only)
//   "gptq"         GPTQ int4 (AutoGPTQ / GPTQModel): bits 4, group_size (-1: one group
//                  per output channel), sym, desc_act, checkpoint_format "gptq" (v1:
//                  qzeros hold zero - 1) or "gptq_v2"
//   "awq"          AutoAWQ int4, version "gemm", zero_point true: bits 4, group_size
//   "compressed-tensors"  format "pack-quantized", weights num_bits 4, type "int",
//                  strategy "group" (group_size) or "channel", symmetric or not, no
//                  input activation scheme (W4A16); every config group the same
// The int4 methods are read by loader/hf_int4/hf_int4.h.
// Anything else (a method we do not implement, "fmt": "e5m2", static FP8 activation
// scales, 8-bit GPTQ) is an error naming the field, not a silent float load of
// quantised codes.
//
// modules_to_not_convert (transformers, AWQ), ignored_layers (vLLM) and ignore
// (compressed-tensors; an entry "re:<regex>" matches module names as Python's re.match
// does, from the start, run by RE2) list modules left in float; `ignores(module)` matches
// an entry on whole dotted components ("lm_head" matches "lm_head"; "model.layers.0.mlp.gate" matches itself and
// anything under it; "gate" matches "model.layers.0.mlp.gate" but not
// "model.layers.0.mlp.gate_proj"), so the loaders can refuse an F8 tensor the config
// says was never converted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace re2 {
class RE2;
}

namespace moe {

struct QuantConfig {
  enum class Method { None, Fp8, Gptq, Awq, CompressedTensors };
  Method method = Method::None;
  std::string method_name;                   // as written ("fp8"), empty when absent
  int64_t block_n = 128, block_k = 128;      // FP8 weight_block_size: rows, cols
  std::vector<std::string> not_converted;    // modules_to_not_convert + ignored_layers + ignore
  std::vector<std::shared_ptr<const re2::RE2>> not_converted_re;  // its "re:" entries, compiled once
  // The int4 methods (GPTQ, AWQ, compressed-tensors pack-quantized):
  int64_t group_size = 0;                    // k values per scale; -1: one per output channel
  bool sym = true;                           // no stored zero points (GPTQ stores 8 anyway)
  bool desc_act = false;                     // GPTQ act-order (g_idx decides the groups)
  bool gptq_v1 = true;                       // GPTQ checkpoint_format "gptq": qzeros hold zero - 1

  bool fp8() const { return method == Method::Fp8; }
  bool int4() const {
    return method == Method::Gptq || method == Method::Awq || method == Method::CompressedTensors;
  }
  // True when `module` (a dotted module name, e.g. "model.layers.3.self_attn.q_proj")
  // is listed, on whole components, in not_converted, or matches one of its "re:" entries.
  bool ignores(const std::string& module) const;
};

// Parses the quantization_config of a config.json object (a missing block gives
// Method::None). Errors name the field and what was expected.
QuantConfig parse_quant_config(const nlohmann::json& config);

// The module of a weight key: "a.b.q_proj.weight" -> "a.b.q_proj"; a fused expert
// tensor "a.experts.gate_up_proj" is its own module.
std::string module_of(const std::string& key);

}  // namespace moe
