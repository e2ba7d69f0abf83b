// A GGUF model as a Checkpoint (loader/checkpoint.h): the config.json a Hugging Face
// checkpoint of the same model has, written from the GGUF metadata, and the GGUF
// tensors under the Hugging Face names the model loaders read, so every layout and
// verb that runs a directory runs the file.
//
// Names: llama.cpp's converter stores the routed experts stacked, blk.N.ffn_gate_exps
// [E, I, H] (ggml ne = {H, I, E}); each expert's rows are one contiguous byte range of
// it, so it appears here as the per-expert keys model.layers.N.mlp.experts.E.gate_proj
// .weight [I, H] that a safetensors checkpoint has: under --ep a rank reads only its
// experts' bytes, as for safetensors.
//
// Types: F32, F16 and BF16 tensors are zero-copy views. A quantised tensor (Q8_0, Q4_K,
// ...: gguf_types.h) is a TensorInfo with its ggml type; every read returns f32 values
// dequantised exactly as ggml does (SafetensorsFile::dequantize_elems), which the
// loaders then convert or quantise like any float weight. A type outside
// ggml_supported_types() is an error naming the tensor, its type and the supported ones.
//
// Architectures: qwen3moe (Qwen3-MoE), qwen2moe (Qwen1.5/Qwen2-MoE), llama with experts
// (Mixtral: its q/k rows, permuted for ggml's interleaved RoPE, run with interleaved
// RoPE), ernie4_5-moe (ERNIE-4.5 MoE) and deepseek2 (DeepSeek-V2/V3, MLA: the
// converter's attn_k_b / attn_v_b are mapped as self_attn.k_b_proj / v_b_proj,
// gguf_deepseek.h).
// Any other architecture is an error naming the supported ones.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/safetensors.h"

namespace moe::gguf {

class GgufModel;

// True when `path` is a regular file whose first 4 bytes are "GGUF".
bool is_gguf_file(const std::string& path);

struct CheckpointTables {
  nlohmann::json config;  // what config.json would hold
  // One tensor table per part of the model, under the Hugging Face names.
  std::vector<std::shared_ptr<SafetensorsFile>> files;
};

// Opens the model (the first part of a split one) and maps it. Errors name the file,
// the key or the tensor.
CheckpointTables open_checkpoint_tables(const std::string& path);
// The same for a model already opened (the fuzzer's in-memory file).
CheckpointTables checkpoint_tables(const GgufModel& m);

// The config.json of a model from its metadata and tensors (exposed for tests).
nlohmann::json config_from_gguf(const GgufModel& m);

}  // namespace moe::gguf
