// Machine-limit probes, measured at run time: the denominators of "fraction of peak".
//
// Each probe runs on `threads` OpenMP threads (<= 0: all, moe::num_threads()) and returns
// the best of a few repetitions. They take 0.1-1 s each; call them once, outside timed
// regions. Not meant to run concurrently with other work (they measure the machine).
#pragma once

#include <cstddef>

namespace moe {

// Streaming read bandwidth in GB/s (1e9 bytes/s) of a `bytes` buffer (default 1 GiB, much
// larger than any L3), split evenly over the threads, read once per repetition with the
// widest vector loads the active ISA has -- the way a decode GEMV streams its weights.
double measure_read_bandwidth_gbs(size_t bytes = size_t(1) << 30, int threads = 0);

// The same streaming read over a caller's buffer (e.g. the packed expert weights, so the
// floor uses the very pages the kernels read: on VMs the bandwidth can differ between
// memory regions, e.g. with and without host huge pages). Read-only; any alignment.
double measure_read_bandwidth_gbs_of(const void* data, size_t bytes, int threads = 0);

// Peak of register-resident multiply-add chains, in GFLOP/s (1 multiply-add = 2 flops):
// vdpbf16ps on zmm = 32 bf16 pairs = 64 flops. 0 if the CPU lacks AVX512_BF16.
double measure_bf16_peak_gflops(int threads = 0);
// f32 FMA peak at the active ISA level (zmm FMA = 32 flops, ymm = 16; portable: SSE
// mul+add). Never 0.
double measure_f32_peak_gflops(int threads = 0);
// int8 VNNI peak in GOP/s: vpdpbusd on zmm = 64 u8*s8 products = 128 ops.
// 0 if the CPU lacks AVX512_VNNI.
double measure_int8_peak_gops(int threads = 0);

}  // namespace moe
