// `moe-ep layer`: runs exactly what one decoder layer's `mlp` module of a Hugging
// Face model computes, on the tensor `hidden_states` [T, H] of an input
// safetensors file, and writes `hidden_states` [T, H] f32 to the output file.
// This contract is how anyone checks the layer against another implementation:
// keep it stable.
#pragma once

#include <string>

#include "core/dtype.h"

namespace moe {

struct LayerCmdOptions {
  std::string model_dir;
  int64_t layer = 0;
  std::string input;
  std::string output;
  DType dtype = DType::F32;  // compute dtype of the weights: f32 or bf16
  bool quiet = false;
};

// Returns normally on success; throws moe::Error with a user-facing message.
void run_layer_cmd(const LayerCmdOptions& opt);

}  // namespace moe
