// The portable grouped-GEMM kernel (grouped_gemm_generic.h) compiled with -mavx2 -mfma:
// the compiler vectorises its 16-column accumulator chunks into ymm FMAs. A hand-tuned
// AVX2 microkernel is not worth it on the machines we target (they have AVX-512).
#include "kernels/grouped_gemm_generic.h"

namespace moe::gg {
void run_task_avx2_f32(const Job& j, const Task& t) { generic_run_task<float>(j, t); }
void run_task_avx2_bf16(const Job& j, const Task& t) { generic_run_task<uint16_t>(j, t); }
}  // namespace moe::gg
