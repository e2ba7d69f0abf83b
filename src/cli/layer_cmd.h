// `moe-ep layer`: runs exactly what one decoder layer's `mlp` module of a Hugging
// Face model computes, on the tensor `hidden_states` [T, H] of an input
// safetensors file, and writes `hidden_states` [T, H] f32 to the output file.
// This contract is how anyone checks the layer against another implementation:
// keep it stable. Under mpirun with --ep/--tp/--dp the input rows are laid out
// over the ranks as the strategy needs, and rank 0 gathers and writes the output,
// so the contract is the same as on one rank.
#pragma once

#include <string>
#include <vector>

#include "cli/parallel_opts.h"
#include "core/dtype.h"

namespace moe {

struct LayerCmdOptions {
  std::string model_dir;
  int64_t layer = 0;
  std::string input;
  std::string output;
  DType dtype = DType::F32;  // compute dtype of the weights: f32 or bf16
  bool quiet = false;
  bool strict = false;  // unexpected tensors in the layer's MLP block are errors
  bool w8a8 = false;    // --quantize w8a8: routed experts as W8A8 int8 (router, shared experts: dtype)
  ParallelOptions parallel;
  std::vector<int64_t> dp_tokens;  // rows per DP replica (uneven, zeros allowed)
};

// Returns normally on success; throws moe::Error with a user-facing message.
void run_layer_cmd(const LayerCmdOptions& opt);

}  // namespace moe
