#include "kernels/probes.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "core/cpu.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/grouped_gemm.h"
#include "kernels/probes_impl.h"

namespace moe {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

// Runs chain(iters) on `nt` threads; returns the best ops/s over reps, given ops per iter per thread.
template <class F>
double peak_of(int nt, double ops_per_iter, F chain) {
  int64_t iters = 1 << 16;
  // Grow until one run takes >= 50 ms single-threaded (stable timing, turbo settled).
  for (;;) {
    const double t0 = now_s();
    volatile double sink = chain(iters);
    (void)sink;
    if (now_s() - t0 > 0.05 || iters > (int64_t(1) << 34)) break;
    iters *= 2;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double t_max = 0;
#pragma omp parallel num_threads(nt)
    {
#pragma omp barrier
      const double t0 = now_s();
      volatile double sink = chain(iters);
      (void)sink;
      const double dt = now_s() - t0;
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
  const bool avx512 = active_isa() >= Isa::Avx512;
  double best = 0;
  uint64_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double t_max = 0;
#pragma omp parallel num_threads(nt) reduction(^ : sink)
    {
      const char* my = base + static_cast<size_t>(omp_get_thread_num()) * chunk;
#pragma omp barrier
      const double t0 = now_s();
      sink ^= avx512 ? probes::read_sum_avx512(my, chunk) : read_sum_portable(my, chunk);
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

double measure_bf16_peak_gflops(int threads) {
  if (!cpu_features().avx512_bf16 || active_isa() < Isa::Avx512Bf16) return 0;
  return peak_of(resolve_threads(threads), probes::kChains * 64.0, probes::bf16_chain) / 1e9;
}

double measure_f32_peak_gflops(int threads) {
  const int nt = resolve_threads(threads);
  if (active_isa() >= Isa::Avx512) return peak_of(nt, probes::kChains * 32.0, probes::f32_chain_avx512) / 1e9;
  return peak_of(nt, 12 * 8.0, f32_portable_chain) / 1e9;  // 4 lanes x (mul + add)
}

double measure_int8_peak_gops(int threads) {
  if (!cpu_features().avx512_vnni || active_isa() < Isa::Avx512) return 0;
  return peak_of(resolve_threads(threads), probes::kChains * 128.0, probes::int8_chain) / 1e9;
}

}  // namespace moe
