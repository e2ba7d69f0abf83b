// Machine-limit probes, measured at run time: the denominators of "fraction of peak".
//
// Each probe runs on `threads` OpenMP threads (<= 0: all, moe::num_threads()) and returns
// the best of a few repetitions. They take 0.1-1 s each; call them once, outside timed
// regions. Not meant to run concurrently with other work (they measure the machine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace moe {

// Streaming read bandwidth in GB/s (1e9 bytes/s) of a `bytes` buffer (default 1 GiB, much
// larger than any L3), split evenly over the threads, read once per repetition with the
// widest vector loads the active ISA has (zmm, ymm; portable: 16-byte) -- the way a
// decode GEMV streams its weights. The buffer is first-touched by its reader threads
// (memset 0x5a) and advised for huge pages like the packed weights; best of 5 reads.
double measure_read_bandwidth_gbs(size_t bytes = size_t(1) << 30, int threads = 0);

// The same streaming read over a caller's buffer (e.g. the packed expert weights, so the
// floor uses the very pages the kernels read: on VMs the bandwidth can differ between
// memory regions, e.g. with and without host huge pages). Read-only; any alignment.
double measure_read_bandwidth_gbs_of(const void* data, size_t bytes, int threads = 0);

// Compute peaks: register-resident chains of exactly the multiply-add instructions a
// kernel runs, on `threads` threads, so that "fraction of peak" compares a kernel with
// what its own instructions can do on this machine. 1 multiply-add = 2 ops (flops).
enum class PeakProbe : uint8_t {
  F32Sse,        // portable: SSE mulps + addps, 4 lanes (8 flops per pair)
  F32Avx2Fma,    // vfmadd ymm: 8 lanes (16 flops)
  F32Avx512Fma,  // vfmadd zmm: 16 lanes (32 flops)
  Bf16Avx512Dp,  // vdpbf16ps zmm: 32 bf16 pairs (64 flops)
  I32Scalar,     // portable int8 kernel: int32 multiply + add (2 ops)
  I8Avx2Madd,    // vpsignb + vpmaddubsw + vpmaddwd + vpaddd per 32 bytes: 32 MACs (64 ops)
  I8Avx512Vnni,  // vpdpbusd zmm: 64 u8 x s8 products (128 ops)
  Bf16AmxTile,   // TDPBF16PS: 16 x 16 outputs x 32 bf16 products (16384 flops)
  I8AmxTile,     // TDPBSSD: 16 x 16 outputs x 64 s8 x s8 products (32768 ops)
};
const char* peak_probe_name(PeakProbe p);  // "avx2-fma-f32", "avx512-vnni-int8", ...
const char* peak_probe_unit(PeakProbe p);  // "GFLOP/s" (float probes) or "GOP/s" (integer)
// What the probe runs, for footers: "12 independent chains of vfmadd ymm (16 flops each)".
std::string peak_probe_what(PeakProbe p);
// The loads measure_read_bandwidth_gbs* use at the active ISA: "zmm", "ymm" or "16-byte".
const char* read_probe_loads();
// Whether this CPU has the probe's instructions and the active ISA level allows them.
bool peak_probe_available(PeakProbe p);
// The probe of the instructions the grouped GEMM runs for `weights` (the routed
// experts' dtype) at active_isa():
//   f32                          f32 FMA of the level (zmm, ymm; portable: SSE mul+add)
//   bf16, fp8 (e4m3, e5m2)       amx: TDPBF16PS; avx512bf16: vdpbf16ps; below: the f32 FMA
//                                of the level (bf16 is widened to f32; fp8 is dequantised
//                                to bf16 first)
//   int8 (W8A8)                  AVX512_VNNI: vpdpbusd; AVX2 (also AVX-512 without VNNI,
//                                which runs the AVX2 kernel): the vpmaddubsw sequence;
//                                portable: scalar int32
//   int8, group_coded (W4A8 and  as int8, except at amx: TDPBSSD (the prefill's tiles; decode
//   the GGUF integer types)      stays on vpdpbusd, whose peak is lower)
// Always an available probe; other dtypes fail with a clear error.
PeakProbe kernel_peak_probe(DType weights, bool group_coded = false);
// Best of 3 runs of the probe, in peak_probe_unit(p) (1e9 ops/s), each run timed by
// the slowest thread's own CPU time (CLOCK_THREAD_CPUTIME_ID: on a shared machine a
// descheduled thread does not lower the peak). > 0. Fails (never
// returns 0) if the probe is not available.
double measure_peak(PeakProbe p, int threads = 0);

}  // namespace moe
