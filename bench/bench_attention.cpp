// GQA attention over the KV cache (model/attention_kernels.h) at long context: one
// sequence's decode step at each --context, and the prefill of each --prefill prompt.
// With --mla: MLA's latent attention (mla_attend) instead, DeepSeek-V3's shape by default
// (128 heads, kv_lora 512, rope 64), checked against mla_attend_reference the same way;
// it is bound by its multiply-adds, so decode is reported against the f32 peak too.
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
//                   [--mla 1 [--kv-lora 512] [--rope 64]]
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
  bool mla = false;  // MLA: plane A the latent c_kv (kv_lora), plane B k_pe (rope), rows
  int64_t kv_lora = 512, rope = 64;
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
  if (s.mla) {        // as the model keeps MLA's latent rows
    ks.a_dim = s.kv_lora;
    ks.b_dim = s.rope;
    ks.a_tiled = false;
    ks.b_heads = 1;
  }
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

// q_lat [heads, n, kv_lora] and q_pe [n, heads, rope] of tokens [0, n) of b; out as q_lat.
MlaAttendArgs mla_args(const AttnShape& s, const StepBatch& b, const KvCache& c, const float* q_lat,
                       const float* q_pe, float* out) {
  MlaAttendArgs a;
  a.batch = &b;
  a.cache = &c;
  a.tc = b.n_tokens();
  a.n_heads = s.heads;
  a.q_lat = q_lat;
  a.q_pe = q_pe;
  a.pe_ld_t = s.heads * s.rope;
  a.pe_ld_h = s.rope;
  a.scale = 0.07f;
  a.o_lat = out;
  return a;
}

// Per query, head and key: kv_lora + rope multiply-adds for the score, kv_lora for the sum.
double mla_flops(const AttnShape& s, double pairs) { return 2.0 * s.heads * (2 * s.kv_lora + s.rope) * pairs; }

void run_mla(const AttnShape& s, const std::vector<int64_t>& contexts, const std::vector<int64_t>& prefills,
             int repeats, double peak) {
  const int64_t L = s.kv_lora;
  std::printf("\n%-10s %12s %12s %14s %14s\n", "decode at", "ms / step", "KV MB read", "GFLOP/s", "of f32 peak");
  for (int64_t n : contexts) {
    const KvCache c = make_cache(s, n);
    const StepBatch b = batch(n - 1, 1);
    const std::vector<float> ql = random_q(s.heads * L), qp = random_q(s.heads * s.rope);
    std::vector<float> got(s.heads * L), ref(s.heads * L);
    mla_attend_reference(mla_args(s, b, c, ql.data(), qp.data(), ref.data()));
    mla_attend(mla_args(s, b, c, ql.data(), qp.data(), got.data()));
    check_equal(got, ref, "MLA decode");
    std::vector<double> t;
    const int calls = static_cast<int>(std::max<int64_t>(1, 20000 / n));
    for (int r = 0; r < repeats; ++r) {
      const double t0 = now_s();
      for (int i = 0; i < calls; ++i) mla_attend(mla_args(s, b, c, ql.data(), qp.data(), got.data()));
      t.push_back((now_s() - t0) / calls);
    }
    const double sec = median(t), flops = mla_flops(s, static_cast<double>(n));
    std::printf("%-10lld %12.3f %12.2f %14.1f %13.0f%%\n", static_cast<long long>(n), sec * 1e3,
                static_cast<double>(n) * (L + s.rope) * dtype_size(s.dtype) / 1e6, flops / sec / 1e9,
                100 * flops / sec / 1e9 / peak);
  }
  std::printf("\n%-10s %12s %14s %14s\n", "prefill", "ms", "GFLOP/s", "of f32 peak");
  for (int64_t n : prefills) {
    const KvCache c = make_cache(s, n);
    const StepBatch b = batch(0, n);
    const std::vector<float> ql = random_q(s.heads * n * L), qp = random_q(n * s.heads * s.rope);
    std::vector<float> got(s.heads * n * L);
    mla_attend(mla_args(s, b, c, ql.data(), qp.data(), got.data()));
    // Sampled tokens (first, middle, last) through the plain loop, each a window of the step.
    for (int64_t t : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> one(s.heads * L), ref(s.heads * L), mine(s.heads * L);
      for (int64_t h = 0; h < s.heads; ++h) {
        std::memcpy(one.data() + h * L, ql.data() + (h * n + t) * L, L * sizeof(float));
        std::memcpy(mine.data() + h * L, got.data() + (h * n + t) * L, L * sizeof(float));
      }
      MlaAttendArgs a = mla_args(s, b, c, one.data(), qp.data(), ref.data());
      a.t0 = t;
      a.tc = 1;
      mla_attend_reference(a);
      check_equal(mine, ref, "MLA prefill row");
    }
    std::vector<double> tm;
    for (int r = 0; r < std::max(1, repeats / 2); ++r) {
      const double t0 = now_s();
      mla_attend(mla_args(s, b, c, ql.data(), qp.data(), got.data()));
      tm.push_back(now_s() - t0);
    }
    const double sec = median(tm), flops = mla_flops(s, static_cast<double>(n) * (n + 1) / 2);  // causal
    std::printf("%-10lld %12.1f %14.1f %13.0f%%\n", static_cast<long long>(n), sec * 1e3, flops / sec / 1e9,
                100 * flops / sec / 1e9 / peak);
  }
}

}  // namespace

int main(int argc, char** argv) {
  AttnShape s;
  std::vector<int64_t> contexts = {512, 4096, 16384, 32768}, prefills = {512, 4096};
  int repeats = 5, threads = 0;
  bool heads_set = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--heads") s.heads = std::atoll(argv[i + 1]), heads_set = true;
    else if (f == "--kv-heads") s.kv = std::atoll(argv[i + 1]);
    else if (f == "--head-dim") s.hd = std::atoll(argv[i + 1]);
    else if (f == "--context") contexts = parse_list(argv[i + 1]);
    else if (f == "--prefill") prefills = parse_list(argv[i + 1]);
    else if (f == "--dtype") s.dtype = std::string(argv[i + 1]) == "f32" ? DType::F32 : DType::BF16;
    else if (f == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (f == "--threads") threads = std::atoi(argv[i + 1]);
    else if (f == "--mla") s.mla = std::atoi(argv[i + 1]) != 0;
    else if (f == "--kv-lora") s.kv_lora = std::atoll(argv[i + 1]);
    else if (f == "--rope") s.rope = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_attention: unknown flag %s (see the header of bench/bench_attention.cpp)\n", argv[i]);
      return 2;
    }
  }
  if (threads > 0) set_num_threads(threads);
  if (s.mla && !heads_set) s.heads = 128;  // DeepSeek-V3's, not the GQA default
  if (s.mla)
    std::printf("MLA latent attention: %lld heads, kv_lora %lld, rope %lld, %s KV cache, %d threads, isa %s\n",
                static_cast<long long>(s.heads), static_cast<long long>(s.kv_lora), static_cast<long long>(s.rope),
                dtype_name(s.dtype), num_threads(), isa_name(active_isa()));
  else
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

  if (s.mla) {
    run_mla(s, contexts, prefills, repeats, peak);
    return 0;
  }
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
