#include "kernels/probes.h"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "core/check.h"
#include "core/clock.h"
#include "core/cpu.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/grouped_gemm.h"
#include "kernels/probes_impl.h"

namespace moe {

namespace {

// CPU time of the calling thread: the compute peaks time their chains with it, so a
// thread the OS deschedules on a shared machine does not read as a slower core.
double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int resolve_threads(int threads) { return threads > 0 ? threads : num_threads(); }

// Baseline (SSE2) streaming read: 8 independent 16-byte accumulators.
uint64_t read_sum_portable(const char* p, size_t bytes) {
  using V = uint64_t __attribute__((vector_size(16)));
  V acc[8] = {};
  const size_t n = bytes / 128;
  for (size_t i = 0; i < n; ++i) {
    const char* q = p + i * 128;
    for (int u = 0; u < 8; ++u) {
      V v;
      std::memcpy(&v, q + 16 * u, 16);
      acc[u] ^= v;
    }
  }
  V s = acc[0];
  for (int u = 1; u < 8; ++u) s ^= acc[u];
  return s[0] ^ s[1];
}

// Register-resident mul+add chains with SSE (the portable f32 peak).
double f32_portable_chain(int64_t iters) {
  using V = float __attribute__((vector_size(16)));
  V acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = V{} + (1.0f + static_cast<float>(i));
  V m = V{} + 0.999999f, a = V{} + 1e-7f;
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * m + a;
    __asm__ volatile("" : "+x"(m));  // keep the compiler from folding the loop
  }
  V s = acc[0];
  for (int i = 1; i < 12; ++i) s += acc[i];
  return static_cast<double>(s[0] + s[1] + s[2] + s[3]);
}

// Register-resident scalar int32 multiply + add chains (the portable int8 kernel's
// arithmetic). Unsigned: wrap-around is defined.
constexpr int kI32Chains = 12;
double i32_portable_chain(int64_t iters) {
  uint32_t acc[kI32Chains];
  for (int i = 0; i < kI32Chains; ++i) acc[i] = 1u + static_cast<uint32_t>(i);
  uint32_t m = 3, a = 7;
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kI32Chains; ++i) acc[i] = acc[i] * m + a;
    __asm__ volatile("" : "+r"(m));
  }
  uint32_t s = 0;
  for (int i = 0; i < kI32Chains; ++i) s += acc[i];
  return static_cast<double>(s);
}

// Runs chain(iters) on `nt` threads; returns the best ops/s over reps, given ops per iter per thread.
template <class F>
double peak_of(int nt, double ops_per_iter, F chain) {
  int64_t iters = 1 << 16;
  // Grow until one run takes >= 50 ms single-threaded (stable timing, turbo settled).
  for (;;) {
    const double t0 = thread_cpu_s();
    volatile double sink = chain(iters);
    (void)sink;
    if (thread_cpu_s() - t0 > 0.05 || iters > (int64_t(1) << 34)) break;
    iters *= 2;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double t_max = 0;
#pragma omp parallel num_threads(nt)
    {
#pragma omp barrier
      const double t0 = thread_cpu_s();
      volatile double sink = chain(iters);
      (void)sink;
      const double dt = thread_cpu_s() - t0;
#pragma omp critical
      t_max = std::max(t_max, dt);
    }
    best = std::max(best, ops_per_iter * static_cast<double>(iters) * nt / t_max);
  }
  return best;
}

}  // namespace

double measure_read_bandwidth_gbs_of(const void* data, size_t bytes, int threads) {
  const int nt = resolve_threads(threads);
  // Whole 256-byte blocks from the first 256-byte boundary, split evenly over the threads.
  const uintptr_t b = (reinterpret_cast<uintptr_t>(data) + 255) & ~uintptr_t(255);
  const size_t usable = bytes > b - reinterpret_cast<uintptr_t>(data) ? bytes - (b - reinterpret_cast<uintptr_t>(data)) : 0;
  const size_t chunk = (usable / nt) / 256 * 256;
  MOE_CHECK(chunk > 0, "measure_read_bandwidth: buffer of {} bytes too small for {} threads", bytes, nt);
  const char* base = reinterpret_cast<const char*>(b);
  const Isa isa = active_isa();
  double best = 0;
  uint64_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double t_max = 0;
#pragma omp parallel num_threads(nt) reduction(^ : sink)
    {
      const char* my = base + static_cast<size_t>(omp_get_thread_num()) * chunk;
#pragma omp barrier
      const double t0 = now_s();
      sink ^= isa >= Isa::Avx512 ? probes::read_sum_avx512(my, chunk)
              : isa >= Isa::Avx2 ? probes::read_sum_avx2(my, chunk)
                                 : read_sum_portable(my, chunk);
      const double dt = now_s() - t0;
#pragma omp critical
      t_max = std::max(t_max, dt);
    }
    best = std::max(best, static_cast<double>(chunk) * nt / t_max / 1e9);
  }
  volatile uint64_t keep = sink;
  (void)keep;
  return best;
}

double measure_read_bandwidth_gbs(size_t bytes, int threads) {
  const int nt = resolve_threads(threads);
  const size_t chunk = (bytes / nt) / 4096 * 4096;
  MOE_CHECK(chunk > 0, "measure_read_bandwidth_gbs: buffer of {} bytes too small for {} threads", bytes, nt);
  Tensor buf = Tensor::empty({static_cast<int64_t>(chunk * nt)}, DType::U8);
  char* base = static_cast<char*>(buf.raw());
  advise_huge_pages(base, chunk * nt);  // like the packed weights (make_packed_experts)
#pragma omp parallel num_threads(nt)
  {
    // First touch by the thread that reads the slice (NUMA-local pages), non-zero data.
    std::memset(base + static_cast<size_t>(omp_get_thread_num()) * chunk, 0x5a, chunk);
  }
  return measure_read_bandwidth_gbs_of(base, chunk * nt, nt);
}

const char* peak_probe_name(PeakProbe p) {
  switch (p) {
    case PeakProbe::F32Sse: return "portable-sse-f32";
    case PeakProbe::F32Avx2Fma: return "avx2-fma-f32";
    case PeakProbe::F32Avx512Fma: return "avx512-fma-f32";
    case PeakProbe::Bf16Avx512Dp: return "avx512-dpbf16";
    case PeakProbe::I32Scalar: return "portable-int32";
    case PeakProbe::I8Avx2Madd: return "avx2-maddubs-int8";
    case PeakProbe::I8Avx512Vnni: return "avx512-vnni-int8";
    case PeakProbe::Bf16AmxTile: return "amx-bf16";
    case PeakProbe::I8AmxTile: return "amx-int8";
  }
  return "?";
}

const char* peak_probe_unit(PeakProbe p) {
  return p == PeakProbe::I32Scalar || p == PeakProbe::I8Avx2Madd || p == PeakProbe::I8Avx512Vnni ||
                 p == PeakProbe::I8AmxTile
             ? "GOP/s"
             : "GFLOP/s";
}

std::string peak_probe_what(PeakProbe p) {
  switch (p) {
    case PeakProbe::F32Sse: return "12 independent chains of SSE mulps + addps (8 flops each)";
    case PeakProbe::F32Avx2Fma:
      return fmt::format("{} independent chains of vfmadd ymm (16 flops each)", probes::kAvx2Chains);
    case PeakProbe::F32Avx512Fma:
      return fmt::format("{} independent chains of vfmadd zmm (32 flops each)", probes::kChains);
    case PeakProbe::Bf16Avx512Dp:
      return fmt::format("{} independent chains of vdpbf16ps zmm (64 flops each)", probes::kChains);
    case PeakProbe::I32Scalar: return fmt::format("{} independent chains of int32 multiply + add", kI32Chains);
    case PeakProbe::I8Avx2Madd:
      return fmt::format("{} independent chains of vmovdqu (L1) + vpsignb + vpmaddubsw + vpmaddwd + vpaddd ymm "
                         "(32 int8 multiply-adds = 64 ops each)",
                         probes::kInt8Chains);
    case PeakProbe::I8Avx512Vnni:
      return fmt::format("{} independent chains of vpdpbusd zmm (128 ops each)", probes::kChains);
    case PeakProbe::Bf16AmxTile:
      return fmt::format("{} independent tiles of TDPBF16PS 16x16x32 (16384 flops each)", probes::kTileChains);
    case PeakProbe::I8AmxTile:
      return fmt::format("{} independent tiles of TDPBSSD 16x16x64 (32768 ops each)", probes::kTileChains);
  }
  return "?";
}

const char* read_probe_loads() {
  const Isa isa = active_isa();
  return isa >= Isa::Avx512 ? "zmm" : isa >= Isa::Avx2 ? "ymm" : "16-byte";
}

bool peak_probe_available(PeakProbe p) {
  const Isa isa = active_isa();
  switch (p) {
    case PeakProbe::F32Sse:
    case PeakProbe::I32Scalar: return true;
    case PeakProbe::F32Avx2Fma:
    case PeakProbe::I8Avx2Madd: return isa >= Isa::Avx2;
    case PeakProbe::F32Avx512Fma: return isa >= Isa::Avx512;
    case PeakProbe::Bf16Avx512Dp: return isa >= Isa::Avx512Bf16;
    case PeakProbe::I8Avx512Vnni: return isa >= Isa::Avx512 && cpu_features().avx512_vnni;
    case PeakProbe::Bf16AmxTile:
    case PeakProbe::I8AmxTile: return isa >= Isa::Amx;
  }
  return false;
}

PeakProbe kernel_peak_probe(DType weights, bool group_coded) {
  const Isa isa = active_isa();
  const PeakProbe f32 = isa >= Isa::Avx512 ? PeakProbe::F32Avx512Fma
                        : isa >= Isa::Avx2 ? PeakProbe::F32Avx2Fma
                                           : PeakProbe::F32Sse;
  switch (weights) {
    case DType::F32: return f32;
    case DType::BF16:
    case DType::F8E4M3:
    case DType::F8E5M2:
      return isa >= Isa::Amx ? PeakProbe::Bf16AmxTile : isa >= Isa::Avx512Bf16 ? PeakProbe::Bf16Avx512Dp : f32;
    case DType::I8:
      if (group_coded && isa >= Isa::Amx) return PeakProbe::I8AmxTile;
      if (peak_probe_available(PeakProbe::I8Avx512Vnni)) return PeakProbe::I8Avx512Vnni;
      return isa >= Isa::Avx2 ? PeakProbe::I8Avx2Madd : PeakProbe::I32Scalar;
    default: break;
  }
  MOE_FAIL("no compute peak probe for {} weights (expected f32, bf16, fp8 or int8)", dtype_name(weights));
}

double measure_peak(PeakProbe p, int threads) {
  MOE_CHECK(peak_probe_available(p), "peak probe {} needs instructions this CPU or the active ISA level ({}) lacks",
            peak_probe_name(p), isa_name(active_isa()));
  const int nt = resolve_threads(threads);
  double ops = 0;
  switch (p) {
    case PeakProbe::F32Sse: ops = peak_of(nt, 12 * 8.0, f32_portable_chain); break;  // 4 lanes x (mul + add)
    case PeakProbe::F32Avx2Fma: ops = peak_of(nt, probes::kAvx2Chains * 16.0, probes::f32_chain_avx2); break;
    case PeakProbe::F32Avx512Fma: ops = peak_of(nt, probes::kChains * 32.0, probes::f32_chain_avx512); break;
    case PeakProbe::Bf16Avx512Dp: ops = peak_of(nt, probes::kChains * 64.0, probes::bf16_chain); break;
    case PeakProbe::I32Scalar: ops = peak_of(nt, kI32Chains * 2.0, i32_portable_chain); break;
    case PeakProbe::I8Avx2Madd: {
      // Small weights (|w| <= 7): vpmaddubsw's s16 pair sums never saturate.
      alignas(64) char w[probes::kInt8Chains * 32];
      for (size_t i = 0; i < sizeof w; ++i) w[i] = static_cast<char>(static_cast<int>(i % 15) - 7);
      ops = peak_of(nt, probes::kInt8Chains * 64.0, [&](int64_t iters) { return probes::int8_chain_avx2(iters, w); });
      break;
    }
    case PeakProbe::I8Avx512Vnni: ops = peak_of(nt, probes::kChains * 128.0, probes::int8_chain); break;
    case PeakProbe::Bf16AmxTile: ops = peak_of(nt, probes::kTileChains * 16384.0, probes::bf16_tile_chain); break;
    case PeakProbe::I8AmxTile: ops = peak_of(nt, probes::kTileChains * 32768.0, probes::int8_tile_chain); break;
  }
  MOE_CHECK(ops > 0, "internal: peak probe {} measured {} ops/s", peak_probe_name(p), ops);
  return ops / 1e9;
}

}  // namespace moe
