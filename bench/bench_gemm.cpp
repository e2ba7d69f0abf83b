// Grouped-GEMM micro-benchmark on the Qwen3-30B-A3B MoE layer shape (H=2048, I=768,
// E=128, top-8): GEMM1 (W13 + SiLU*up, bf16 out) + GEMM2 (W2, f32 out) for T tokens
// routed uniformly at random, each iteration with fresh routing so the touched experts
// (1.2 GB of bf16 weights in all, far above L3) are mostly cold. Checks the result against
// the reference first, then prints ms/call, GB/s of touched weights, GFLOP/s and the
// fractions of the machine limits measured by the probes in the same run.
//
//   bench_gemm [--threads N] [--iters N] [--dtype bf16|f32] [--tokens 1,16,128,512]
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/grouped_gemm.h"
#include "kernels/probes.h"

using namespace moe;

namespace {

constexpr int64_t kH = 2048, kI = 768, kE = 128, kTopK = 8;

// Fills packed storage with small random values (the layout does not matter for timing;
// this shape has no padding). Parallel: 1.2 GB.
void fill_random(Tensor& t) {
  const int64_t n = t.numel();
  const bool bf16 = t.dtype() == DType::BF16;
#pragma omp parallel
  {
    uint64_t s = 0x9E3779B97F4A7C15ull * (omp_get_thread_num() + 1);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      const float v = (static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 0.1f;
      if (bf16)
        static_cast<uint16_t*>(t.raw())[i] = f32_to_bf16(v);
      else
        static_cast<float*>(t.raw())[i] = v;
    }
  }
}

struct Routing {
  std::vector<int64_t> offsets;  // [E+1]
  int64_t n_distinct = 0;
};

Routing route(int64_t T, std::mt19937& rng) {
  std::vector<int64_t> count(kE, 0);
  std::vector<int> ids(kE);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < kE; ++i) ids[i] = i;
    for (int j = 0; j < kTopK; ++j) {  // partial Fisher-Yates: k distinct experts
      std::uniform_int_distribution<int> d(j, kE - 1);
      std::swap(ids[j], ids[d(rng)]);
      ++count[ids[j]];
    }
  }
  Routing r;
  r.offsets.assign(kE + 1, 0);
  for (int64_t e = 0; e < kE; ++e) {
    r.offsets[e + 1] = r.offsets[e] + count[e];
    r.n_distinct += count[e] > 0;
  }
  return r;
}

double max_rel_err(const void* got, const void* want, DType dt, int64_t n) {
  double m = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = dt == DType::F32 ? static_cast<const float*>(want)[i]
                                      : bf16_to_f32(static_cast<const uint16_t*>(want)[i]);
    scale = std::max(scale, std::abs(w));
  }
  for (int64_t i = 0; i < n; ++i) {
    const double g = dt == DType::F32 ? static_cast<const float*>(got)[i]
                                      : bf16_to_f32(static_cast<const uint16_t*>(got)[i]);
    const double w = dt == DType::F32 ? static_cast<const float*>(want)[i]
                                      : bf16_to_f32(static_cast<const uint16_t*>(want)[i]);
    m = std::max(m, std::abs(g - w) / scale);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, iters = 20;
  DType dt = DType::BF16;
  std::vector<int64_t> tokens = {1, 16, 128, 512};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--dtype") dt = parse_dtype(next());
    else if (a == "--tokens") {
      tokens.clear();
      const std::string s = next();
      for (size_t p = 0; p < s.size();) {
        const size_t q = s.find(',', p);
        tokens.push_back(std::atoll(s.substr(p, q - p).c_str()));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--iters N] [--dtype bf16|f32] [--tokens 1,16,128,512]\n", argv[0]);
      return 2;
    }
  }
  set_num_threads(threads);
  const int nt = num_threads();
  std::printf("cpu: %s, threads %d, dtype %s\n", cpu_summary().c_str(), nt, dtype_name(dt));

  const double bw_fresh = measure_read_bandwidth_gbs(size_t(1) << 30, nt);
  // The peak of the instructions this dtype's kernel runs at the active ISA (probes.h).
  const PeakProbe probe = kernel_peak_probe(dt);
  const double peak = measure_peak(probe, nt);
  std::printf("probes: read %.1f GB/s (fresh 1 GiB, %s loads), peak: %s %.0f %s\n", bw_fresh, read_probe_loads(),
              peak_probe_name(probe), peak, peak_probe_unit(probe));

  PackedExperts w13 = make_packed_experts(kE, 2 * kI, kH, dt, true);
  PackedExperts w2 = make_packed_experts(kE, kH, kI, dt, false);
  fill_random(w13.data);
  fill_random(w2.data);
  const double bytes_per_expert = static_cast<double>(w13.bytes_per_expert() + w2.bytes_per_expert());
  // The floor uses the slower of the two: a fresh buffer and the weights' own pages.
  const double bw13 = measure_read_bandwidth_gbs_of(w13.data.raw(), w13.data.nbytes(), nt);
  const double bw = std::min(bw_fresh, bw13);
  std::printf("weights: %.2f GB (%.2f MB per expert), streaming read of W13 itself %.1f GB/s -> floor at %.1f GB/s\n",
              kE * bytes_per_expert / 1e9, bytes_per_expert / 1e6, bw13, bw);

  std::mt19937 rng(1234);
  const int64_t max_rows = *std::max_element(tokens.begin(), tokens.end()) * kTopK;
  Tensor a1 = Tensor::empty({max_rows, kH}, DType::F32);
  {
    float* p = a1.data<float>();
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < a1.numel(); ++i) p[i] = nd(rng);
  }
  a1 = a1.to(dt);
  Tensor c1 = Tensor::empty({max_rows, kI}, dt);  // GEMM1 out = GEMM2 in
  Tensor c2 = Tensor::empty({max_rows, kH}, DType::F32);

  auto gemm1 = [&](const Routing& r, void* out) {
    GroupedGemmParams p;
    p.w = &w13, p.a = a1.raw(), p.lda = kH, p.offsets = r.offsets.data();
    p.c = out, p.c_dtype = dt, p.ldc = kI, p.act = Activation::SiluMul;
    return p;
  };
  auto gemm2 = [&](const Routing& r, void* out) {
    GroupedGemmParams p;
    p.w = &w2, p.a = c1.raw(), p.lda = kI, p.offsets = r.offsets.data();
    p.c = out, p.c_dtype = DType::F32, p.ldc = kH, p.act = Activation::None;
    return p;
  };

  {  // Check first: kernels vs reference on a T=4 routing.
    const Routing r = route(4, rng);
    const int64_t rows = r.offsets[kE];
    Tensor ref1 = Tensor::empty({rows, kI}, dt), ref2 = Tensor::empty({rows, kH}, DType::F32);
    grouped_gemm(gemm1(r, c1.raw()));
    grouped_gemm_reference(gemm1(r, ref1.raw()));
    const double e1 = max_rel_err(c1.raw(), ref1.raw(), dt, rows * kI);
    grouped_gemm(gemm2(r, c2.raw()));
    grouped_gemm_reference(gemm2(r, ref2.raw()));
    const double e2 = max_rel_err(c2.raw(), ref2.raw(), DType::F32, rows * kH);
    std::printf("check vs reference: GEMM1 max err %.2e, GEMM2 %.2e (relative to max |out|)\n", e1, e2);
    if (!(e1 < 1e-2 && e2 < 1e-4)) {
      std::printf("CHECK FAILED\n");
      return 1;
    }
  }

  std::printf("%5s %8s %9s %9s %9s %8s %9s %8s %8s %8s\n", "T", "experts", "ms", "ms_g1", "ms_g2", "GB/s", "GFLOP/s",
              "%bw", "%peak", "floor_ms");
  for (int64_t T : tokens) {
    std::vector<double> t_all, t1s, t2s, gbs, fl, floor_ms;
    double experts = 0;
    for (int it = 0; it < iters + 2; ++it) {
      const Routing r = route(T, rng);
      const double t0 = now_s();
      grouped_gemm(gemm1(r, c1.raw()));
      const double t1 = now_s();
      grouped_gemm(gemm2(r, c2.raw()));
      const double t2 = now_s();
      if (it < 2) continue;  // warm-up (threads, page tables)
      const double bytes = r.n_distinct * bytes_per_expert;
      const double flops = 2.0 * T * kTopK * (2 * kI * kH + kH * kI);
      t_all.push_back(t2 - t0);
      t1s.push_back(t1 - t0);
      t2s.push_back(t2 - t1);
      gbs.push_back(bytes / (t2 - t0) / 1e9);
      fl.push_back(flops / (t2 - t0) / 1e9);
      floor_ms.push_back(bytes / (bw * 1e9) * 1e3);
      experts += r.n_distinct;
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    // Per-iteration ratios (the touched bytes vary with routing), medians over iterations.
    std::vector<double> frac_bw(t_all.size());
    for (size_t i = 0; i < t_all.size(); ++i) frac_bw[i] = floor_ms[i] / (t_all[i] * 1e3);
    const double gf = median(fl);
    std::printf("%5lld %8.1f %9.3f %9.3f %9.3f %8.1f %9.1f %7.1f%% %7.1f%% %8.3f\n", static_cast<long long>(T),
                experts / t_all.size(), median(t_all) * 1e3, median(t1s) * 1e3, median(t2s) * 1e3, median(gbs), gf,
                100 * median(frac_bw), 100 * gf / peak, median(floor_ms));
  }
  return 0;
}
