// Private to probes*.cpp: the AVX-512 probe loops (probes_avx512.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe::probes {

// Independent accumulator chains per thread: covers latency (vdpbf16ps/FMA ~4-6 cycles)
// times issue width (2 x 256-bit pipes on Zen4, 2 x 512 on Intel servers) with margin.
inline constexpr int kChains = 16;

uint64_t read_sum_avx512(const char* p, size_t bytes);  // bytes: multiple of 256
double bf16_chain(int64_t iters);        // iters x kChains vdpbf16ps zmm
double f32_chain_avx512(int64_t iters);  // iters x kChains vfmadd zmm
double int8_chain(int64_t iters);        // iters x kChains vpdpbusd zmm

}  // namespace moe::probes
