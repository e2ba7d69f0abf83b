// `moe-ep compare A B`: compares one tensor of two safetensors files (default
// 'hidden_states'), prints the largest differences, and fails beyond tolerance.
// How a user checks moe-ep's output against another implementation's.
#pragma once

#include <string>

namespace moe {

struct CompareOptions {
  std::string a, b;
  std::string tensor = "hidden_states";
  double atol = 1e-3;
  double rtol = 1.6e-2;
  std::string label;
};

// Returns the exit code: 0 within tolerance, 3 outside.
int run_compare_cmd(const CompareOptions& opt);

}  // namespace moe
