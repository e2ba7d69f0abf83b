// GQA attention over the KV cache (model/attention_kernels.h) at long context: one
// sequence's decode step at each --context, and the prefill of each --prefill prompt.
//
// Checks first: a decode step and sampled prefill rows against the plain loop
// (gqa_attend_reference), bit for bit. Then times gqa_attend (median of --repeats) and
// prints, per decode context, the KV bytes the step reads over its time against the
// read bandwidth probed in the same run (kernels/probes.h), and per prefill the causal
// multiply-adds per second against the f32 peak of the active ISA (the kernel's dot
// products and V sums are fused multiply-adds, model/attention_math.h, so that peak is
// its ceiling; the softmax's exp and the folds come on top).
//
//   bench_attention [--heads 32] [--kv-heads 4] [--head-dim 128] [--context 512,4096,16384,32768]
//                   [--prefill 512,4096] [--dtype bf16|f32] [--repeats 5] [--threads N]
// Defaults: Qwen3-30B-A3B's attention (32 query heads, 4 KV heads, head_dim 128), bf16 cache.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "kernels/probes.h"
#include "model/attention_kernels.h"

using namespace moe;

namespace {

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

using bench::median;

struct AttnShape {
  int64_t heads = 32, kv = 4, hd = 128;
  DType dtype = DType::BF16;
};

// A one-slot cache of `n` positions filled with a fixed pseudo-random pattern.
KvCache make_cache(const AttnShape& s, int64_t n) {
  KvCacheShape ks;
  ks.n_layers = 1;
  ks.n_slots = 1;
  ks.max_seq = n;
  ks.a_dim = ks.b_dim = s.kv * s.hd;
  ks.dtype = s.dtype;
  ks.a_tiled = true;  // as the model keeps GQA's K
  ks.b_heads = s.kv;  // and its V
  KvCache c(ks);
  std::vector<float> row(ks.a_dim);
  uint32_t x = 12345;
  auto rnd = [&] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / (1 << 23);
  };
  for (int64_t p = 0; p < n; ++p) {
    for (float& v : row) v = rnd();
    c.put_a(0, 0, p, row.data());
    for (float& v : row) v = rnd();
    c.put_b(0, 0, p, row.data());
  }
  return c;
}

std::vector<float> random_q(int64_t n) {
  std::vector<float> q(n);
  uint32_t x = 777;
  for (float& v : q) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / (1 << 23);
  }
  return q;
}

GqaAttendArgs args(const AttnShape& s, const StepBatch& b, const KvCache& c, const float* q, float* ctx) {
  GqaAttendArgs a;
  a.batch = &b;
  a.cache = &c;
  a.q = q;
  a.ctx = ctx;
  a.n_heads = s.heads;
  a.n_kv = s.kv;
  a.head_dim = s.hd;
  a.scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  return a;
}

// Tokens [start, start + n) of slot 0.
StepBatch batch(int64_t start, int64_t n) {
  StepBatch b;
  b.seqs.push_back({0, 0, n, start});
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(0);
    b.positions.push_back(static_cast<int32_t>(start + i));
  }
  return b;
}

void check_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "bench_attention: %s differs from the plain loop\n", what);
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  AttnShape s;
  std::vector<int64_t> contexts = {512, 4096, 16384, 32768}, prefills = {512, 4096};
  int repeats = 5, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--heads") s.heads = std::atoll(argv[i + 1]);
    else if (f == "--kv-heads") s.kv = std::atoll(argv[i + 1]);
    else if (f == "--head-dim") s.hd = std::atoll(argv[i + 1]);
    else if (f == "--context") contexts = parse_list(argv[i + 1]);
    else if (f == "--prefill") prefills = parse_list(argv[i + 1]);
    else if (f == "--dtype") s.dtype = std::string(argv[i + 1]) == "f32" ? DType::F32 : DType::BF16;
    else if (f == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (f == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_attention: unknown flag %s (see the header of bench/bench_attention.cpp)\n", argv[i]);
      return 2;
    }
  }
  if (threads > 0) set_num_threads(threads);
  std::printf("GQA attention: %lld query heads, %lld KV heads, head_dim %lld, %s KV cache, %d threads, isa %s\n",
              static_cast<long long>(s.heads), static_cast<long long>(s.kv), static_cast<long long>(s.hd),
              dtype_name(s.dtype), num_threads(), isa_name(active_isa()));
  const double bw = measure_read_bandwidth_gbs();
  const PeakProbe probe = active_isa() >= Isa::Avx512 ? PeakProbe::F32Avx512Fma
                          : active_isa() == Isa::Avx2 ? PeakProbe::F32Avx2Fma
                                                      : PeakProbe::F32Sse;
  const double peak = measure_peak(probe);
  std::printf("machine: read %.1f GB/s (%s loads), f32 peak %.0f GFLOP/s (%s)\n", bw, read_probe_loads(), peak,
              peak_probe_name(probe));

  const int64_t ld = s.heads * s.hd;
  std::printf("\n%-10s %12s %12s %10s %14s\n", "decode at", "ms / step", "KV MB read", "GB/s", "of read bw");
  for (int64_t n : contexts) {
    const KvCache c = make_cache(s, n);
    const StepBatch b = batch(n - 1, 1);
    const std::vector<float> q = random_q(ld);
    std::vector<float> got(ld), ref(ld);
    gqa_attend_reference(args(s, b, c, q.data(), ref.data()));
    gqa_attend(args(s, b, c, q.data(), got.data()));
    check_equal(got, ref, "decode");
    std::vector<double> t;
    const int calls = static_cast<int>(std::max<int64_t>(1, 200000 / n));
    for (int r = 0; r < repeats; ++r) {
      const double t0 = now_s();
      for (int i = 0; i < calls; ++i) gqa_attend(args(s, b, c, q.data(), got.data()));
      t.push_back((now_s() - t0) / calls);
    }
    const double sec = median(t), bytes = 2.0 * n * s.kv * s.hd * dtype_size(s.dtype);
    std::printf("%-10lld %12.3f %12.2f %10.1f %13.0f%%\n", static_cast<long long>(n), sec * 1e3, bytes / 1e6,
                bytes / sec / 1e9, 100 * bytes / sec / 1e9 / bw);
  }

  std::printf("\n%-10s %12s %14s %14s\n", "prefill", "ms", "GFLOP/s", "of f32 peak");
  for (int64_t n : prefills) {
    const KvCache c = make_cache(s, n);
    const StepBatch b = batch(0, n);
    const std::vector<float> q = random_q(n * ld);
    std::vector<float> got(n * ld);
    gqa_attend(args(s, b, c, q.data(), got.data()));
    // Sampled rows (first, middle, last tokens) as single-token steps through the plain loop.
    for (int64_t t : {int64_t{0}, n / 2, n - 1}) {
      const StepBatch bt = batch(t, 1);
      std::vector<float> ref(ld);
      gqa_attend_reference(args(s, bt, c, q.data() + t * ld, ref.data()));
      check_equal(std::vector<float>(got.begin() + t * ld, got.begin() + (t + 1) * ld), ref, "prefill row");
    }
    std::vector<double> tm;
    for (int r = 0; r < std::max(1, repeats / 2); ++r) {
      const double t0 = now_s();
      gqa_attend(args(s, b, c, q.data(), got.data()));
      tm.push_back(now_s() - t0);
    }
    // Causal: token t sees t + 1 keys; 2 multiply-adds per (query head, key, dim): q.k and p.v.
    const double flops = 2.0 * 2.0 * s.heads * s.hd * (static_cast<double>(n) * (n + 1) / 2);
    const double sec = median(tm);
    std::printf("%-10lld %12.1f %14.1f %13.0f%%\n", static_cast<long long>(n), sec * 1e3, flops / sec / 1e9,
                100 * flops / sec / 1e9 / peak);
  }
  return 0;
}
