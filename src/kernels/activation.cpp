// parse_activation (declared in grouped_gemm.h) on its own: config.json parsing needs it,
// and it builds without the kernels (OpenMP, ISA code), as the config fuzzer compiles it.
#include "core/check.h"
#include "kernels/grouped_gemm.h"

namespace moe {

Activation parse_activation(const std::string& s) {
  if (s == "silu" || s == "swish" || s == "swiglu") return Activation::SiluMul;
  if (s == "gelu" || s == "gelu_erf") return Activation::GeluErfMul;
  if (s == "gelu_pytorch_tanh" || s == "gelu_new" || s == "gelu_tanh" || s == "gelu_fast")
    return Activation::GeluTanhMul;
  MOE_FAIL("unknown activation '{}': expected silu, gelu, gelu_pytorch_tanh or gelu_new", s);
}

}  // namespace moe
