// bf16 against int8 (W8A8) or fp8 (e4m3, dequantised in the GEMM) routed experts on one
// MoE layer, call by call in alternation.
//
// `moe-ep bench --dtype bf16,int8` times the two dtypes one after the other, each for its
// own seconds; on a shared VM whose read bandwidth drifts by 2x from minute to minute
// (docs/PERF.md) the ratio of two such blocks measures the drift as much as the kernels.
// Here both layers live side by side and every iteration runs the same input through
// bf16 and int8 back to back (the order alternating), so both see the same machine
// state; the speed-up reported is the median of the per-iteration ratios, next to the
// ratio of the medians. Per dtype: the whole layer forward (router, routing, expand,
// GEMM1 + activation, requantisation, GEMM2, combine) and the two expert GEMMs alone on
// the same rows. Weight bytes: the touched experts' packed weights (int8 scales and
// compensation included) and the f32 router.
//
//   bench_decode_ab [--shape qwen3-30b-a3b] [--tokens 1,16] [--calls 400] [--threads N] [--other int8|fp8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "kernels/probes.h"
#include "kernels/quant.h"
#include "moe/fused_moe.h"

using namespace moe;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times of one dtype's pieces for one call, seconds.
struct Times {
  double forward = 0, gemm1 = 0, gemm2 = 0;
};

// The layer forward on x, then its two expert GEMMs alone on rows grouped by `offsets`
// (rows per expert; the caller passes another input's routing, so the GEMMs do not find
// the experts the forward just read in L3; the A operands are scratch of the right
// dtype and size, whose values do not change the timing).
Times time_call(MoeLayer& layer, const Tensor& x, const std::vector<int64_t>& offsets, MoeScratch& s) {
  Times t;
  double t0 = moe::now_s();
  layer.forward(x);
  t.forward = moe::now_s() - t0;
  const MoeLayerWeights& w = layer.weights();
  const bool q8 = layer.quantized();
  const int64_t rows = offsets.back(), H = w.w13.k, I = w.w2.k;
  const int64_t lda1 = q8 ? q8_row_bytes(H) : H, lda2 = q8 ? q8_row_bytes(I) : I;
  const DType in_dt = q8 ? DType::I8 : w.w13.act_dtype();
  Tensor& a1 = MoeScratch::ensure(s.a, rows, lda1, in_dt);
  Tensor& a2 = MoeScratch::ensure(s.inter_q, rows, lda2, in_dt);
  Tensor& inter = MoeScratch::ensure(s.inter, rows, I, DType::F32);
  Tensor& out = MoeScratch::ensure(s.out, rows, H, DType::F32);
  GroupedGemmParams g1;
  g1.w = &w.w13;
  g1.a = a1.raw();
  g1.lda = lda1;
  g1.offsets = offsets.data();
  g1.c = inter.raw();
  g1.c_dtype = DType::F32;
  g1.ldc = I;
  g1.act = layer.config().act;
  GroupedGemmParams g2 = g1;
  g2.w = &w.w2;
  g2.a = a2.raw();
  g2.lda = lda2;
  g2.c = out.raw();
  g2.ldc = H;
  g2.act = Activation::None;
  t0 = moe::now_s();
  grouped_gemm(g1);
  t.gemm1 = moe::now_s() - t0;
  t0 = moe::now_s();
  grouped_gemm(g2);
  t.gemm2 = moe::now_s() - t0;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  o.tokens = {1, 16};
  int calls = 400, threads = 0;
  std::string other = "int8";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--shape") o.shape = next();
    else if (a == "--calls") calls = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--other") other = next();
    else if (a == "--tokens") {
      o.tokens.clear();
      for (const std::string& t : bench::dtype_list(next())) o.tokens.push_back(std::atoll(t.c_str()));
    } else {
      std::fprintf(stderr, "usage: %s [--shape %s] [--tokens 1,16] [--calls N] [--threads N] [--other int8|fp8]\n", argv[0],
                   bench::shape_names().c_str());
      return 2;
    }
  }
  set_num_threads(threads);
  const MoeConfig cfg = bench::bench_config(o);
  const int64_t H = cfg.hidden_size, E = cfg.n_experts;
  std::printf("bench_decode_ab: shape %s (H=%ld I=%ld E=%ld k=%ld), %d threads, %d calls per token count\n  cpu: %s\n",
              o.shape.c_str(), long(H), long(cfg.moe_intermediate_size), long(E), long(cfg.top_k), num_threads(),
              calls, cpu_summary().c_str());
  if (other != "int8" && other != "fp8") {
    std::fprintf(stderr, "--other must be int8 or fp8, got '%s'\n", other.c_str());
    return 2;
  }
  MoeLayer layers[2] = {MoeLayer(cfg, bench::random_layer(cfg, DType::BF16, 0, E)),
                        MoeLayer(cfg, bench::random_layer(cfg, parse_dtype(other), 0, E))};
  const char* names[2] = {"bf16", other.c_str()};
  // Bytes per expert of W13 and W2: packed weights, plus the int8 scales and compensation
  // or the fp8 block scales.
  double w13_bytes[2], w2_bytes[2];
  for (int d = 0; d < 2; ++d) {
    auto bytes = [&](const PackedExperts& p) {
      const double q = (p.w_scale.defined() ? double(p.w_scale.nbytes()) : 0.0) +
                       (p.w_comp.defined() ? double(p.w_comp.nbytes()) : 0.0);
      return double(p.bytes_per_expert()) + q / E;
    };
    w13_bytes[d] = bytes(layers[d].weights().w13);
    w2_bytes[d] = bytes(layers[d].weights().w2);
  }
  const double router_bytes = 4.0 * E * H;
  MoeScratch scratch[2];

  for (int64_t T : o.tokens) {
    constexpr int kPool = 16;  // fresh inputs: the touched experts change from call to call
    std::vector<Tensor> xs;
    std::vector<Routing> rs(kPool);  // only for the rows per expert
    std::vector<std::vector<int64_t>> offs(kPool);
    double touched = 0;
    for (int i = 0; i < kPool; ++i) {
      xs.push_back(bench::random_tensor({T, H}, 1.f, 7919ull * T + i));
      layers[0].route(xs[i], rs[i]);  // both layers share the router weights (same seed)
      offs[i].assign(E + 1, 0);
      for (int64_t e = 0; e < E; ++e) {
        offs[i][e + 1] = offs[i][e] + rs[i].index.counts[e];
        touched += rs[i].index.counts[e] > 0;
      }
    }
    touched /= kPool;
    const double bw_before = measure_read_bandwidth_gbs(size_t(512) << 20, num_threads());
    std::vector<Times> t[2];
    std::vector<double> ratio[3];  // bf16 time / other time of each call: forward, GEMM1, GEMM2
    for (int d = 0; d < 2; ++d) time_call(layers[d], xs[0], offs[0], scratch[d]);  // warm-up
    for (int c = 0; c < calls; ++c) {
      const int i = c % kPool;
      Times now[2];
      for (int k = 0; k < 2; ++k) {
        const int d = (c + k) % 2;  // alternate which dtype goes first
        now[d] = time_call(layers[d], xs[i], offs[(i + kPool / 2) % kPool], scratch[d]);
      }
      for (int d = 0; d < 2; ++d) t[d].push_back(now[d]);
      ratio[0].push_back(now[0].forward / now[1].forward);
      ratio[1].push_back(now[0].gemm1 / now[1].gemm1);
      ratio[2].push_back(now[0].gemm2 / now[1].gemm2);
    }
    const double bw_after = measure_read_bandwidth_gbs(size_t(512) << 20, num_threads());
    std::printf("\ntokens %ld: %.1f experts touched per call; read bandwidth %.1f GB/s before, %.1f after\n", long(T),
                touched, bw_before, bw_after);
    std::printf("  %-5s %12s %9s %12s %9s %12s %9s\n", "dtype", "forward ms", "GB/s", "GEMM1 ms", "GB/s", "GEMM2 ms",
                "GB/s");
    double fwd[2];
    for (int d = 0; d < 2; ++d) {
      std::vector<double> f, g1, g2;
      for (const Times& x : t[d]) {
        f.push_back(x.forward);
        g1.push_back(x.gemm1);
        g2.push_back(x.gemm2);
      }
      const double b13 = touched * w13_bytes[d], b2 = touched * w2_bytes[d];
      fwd[d] = median(f);
      std::printf("  %-5s %12.3f %9.1f %12.3f %9.1f %12.3f %9.1f\n", names[d], fwd[d] * 1e3,
                  (b13 + b2 + router_bytes) / fwd[d] / 1e9, median(g1) * 1e3, b13 / median(g1) / 1e9,
                  median(g2) * 1e3, b2 / median(g2) / 1e9);
    }
    std::printf("  %s speed-up (median of per-call ratios): forward %.2fx, GEMM1 %.2fx, GEMM2 %.2fx; forward, ratio "
                "of medians: %.2fx\n",
                names[1], median(ratio[0]), median(ratio[1]), median(ratio[2]), fwd[0] / fwd[1]);
  }
  return 0;
}
