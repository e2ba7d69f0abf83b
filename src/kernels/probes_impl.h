// Private to probes*.cpp: the AVX2 and AVX-512 probe loops (probes_avx2.cpp,
// probes_avx512.cpp).
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
// AMX (probes_amx.cpp): iters x 4 tile products into 4 independent C tiles.
inline constexpr int kTileChains = 4;
double bf16_tile_chain(int64_t iters);  // TDPBF16PS 16 x 16 x 32: 16384 flops each
double int8_tile_chain(int64_t iters);  // TDPBSSD 16 x 16 x 64: 32768 ops each

// AVX2 has 16 ymm registers. f32: 12 FMA chains cover Zen 3's 2 FMA pipes x latency 4
// (8 in flight) and Intel's 2 x 4 with margin, leaving 2 registers for the operands.
inline constexpr int kAvx2Chains = 12;
// int8: the accumulation chain is one vpaddd (latency 1); 8 chains keep both multiply
// pipes busy while leaving registers for |a|, a, ones and the temporaries.
inline constexpr int kInt8Chains = 8;
uint64_t read_sum_avx2(const char* p, size_t bytes);  // bytes: multiple of 256
double f32_chain_avx2(int64_t iters);                  // iters x kAvx2Chains vfmadd ymm
// iters x kInt8Chains (vpsignb + vpmaddubsw + vpmaddwd + vpaddd) on the 32-byte weight
// vectors w[0..kInt8Chains*32) (L1-resident, small values).
double int8_chain_avx2(int64_t iters, const char* w);

}  // namespace moe::probes
