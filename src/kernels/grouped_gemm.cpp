// Grouped GEMM: allocation of the packed weights, the scalar reference, task building and
// ISA dispatch, and the portable kernel. Packing itself (pack_expert, unpack_expert) is in
// pack.cpp, the AVX-512 kernels in grouped_gemm_avx512.cpp, the AVX2 kernels in
// grouped_gemm_avx2.cpp and grouped_gemm_int8_avx2.cpp. Layout: see grouped_gemm_impl.h.
#include "kernels/grouped_gemm.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/grouped_gemm_generic.h"
#include "kernels/grouped_gemm_impl.h"
#include "kernels/quant.h"

namespace moe {

using gg::kGateCols;
using gg::kPanel;

void advise_huge_pages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  // Only whole 2 MiB pages inside the buffer; harmless where THP is off ("never").
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

PackedExperts make_packed_experts(int64_t n_experts, int64_t n, int64_t k, DType dtype, bool gated) {
  MOE_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::I8,
            "packed experts: dtype must be f32, bf16 or i8, got {}", dtype_name(dtype));
  MOE_CHECK(n_experts >= 0 && n > 0 && k > 0, "packed experts: bad shape E={} n={} k={}", n_experts, n, k);
  MOE_CHECK(!gated || n % 2 == 0, "packed experts: gated weights need an even n (gate + up rows), got n={}", n);
  PackedExperts p;
  p.dtype = dtype;
  p.n_experts = n_experts;
  p.n = n;
  p.k = k;
  p.gated = gated;
  p.expert_stride = gg::n_panels(n, gated) * gg::panel_elems(k, dtype);
  // Zeroed, so the padding columns and the padding k of an odd K read as 0 (the i8
  // packer writes only real columns) and an expert never packed reads as zeros.
  p.data = zeroed_huge_pages({n_experts * p.expert_stride}, dtype);
  if (dtype == DType::I8) gg::alloc_q8(p);
  return p;
}

float act_gate(Activation act, float gate) { return gg::ActMath<gg::ScalarOps>::gate(act, gate); }

namespace {

void check_params(const GroupedGemmParams& p) {
  MOE_CHECK(p.w != nullptr, "grouped_gemm: no weights");
  const PackedExperts& w = *p.w;
  MOE_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::I8 || w.dtype == DType::F8E4M3,
            "grouped_gemm: weights must be f32, bf16, i8 or f8e4m3");
  MOE_CHECK(p.c_dtype == DType::F32 || p.c_dtype == DType::BF16 ||
                (p.c_dtype == DType::I32 && w.dtype == DType::I8 && w.int4_group == 0 && p.act == Activation::None),
            "grouped_gemm: c_dtype must be f32 or bf16 (i32: raw accumulators of i8 weights without activation), "
            "got {}",
            dtype_name(p.c_dtype));
  MOE_CHECK(p.act == Activation::None || w.gated, "grouped_gemm: an activation needs gated (W13) weights");
  MOE_CHECK(p.offsets != nullptr, "grouped_gemm: no offsets");
  MOE_CHECK(p.offsets[0] >= 0, "grouped_gemm: offsets[0] = {} < 0", p.offsets[0]);
  for (int64_t e = 0; e < w.n_experts; ++e)
    MOE_CHECK(p.offsets[e] <= p.offsets[e + 1], "grouped_gemm: offsets not monotonic at expert {} ({} > {})", e,
              p.offsets[e], p.offsets[e + 1]);
  if (p.offsets[w.n_experts] > p.offsets[0]) {
    MOE_CHECK(p.a != nullptr && p.c != nullptr, "grouped_gemm: null a or c");
    MOE_CHECK(p.lda >= (w.dtype == DType::I8 ? q8_row_bytes(w.k) : w.k), "grouped_gemm: lda {} too small for k {}",
              p.lda, w.k);
    MOE_CHECK(p.ldc >= w.n_out(), "grouped_gemm: ldc {} < n_out {}", p.ldc, w.n_out());
  }
}

// Act-order experts (PackedExperts::in_perm): p with its rows gathered into buf, each
// expert's Q8 row in its weight's column order (the scale tail copied: a row's scale does
// not depend on the order of its values), so the kernels and the reference see whole groups.
// Row r stays row r (rows before offsets[0] are left unwritten).
GroupedGemmParams gather_in_perm(const GroupedGemmParams& p, std::vector<char>& buf) {
  const PackedExperts& w = *p.w;
  MOE_CHECK(w.int4_group > 0 && w.in_perm.dtype() == DType::I32 && w.in_perm.shape() == Shape({w.n_experts, w.k}),
            "grouped_gemm: in_perm {} for {} group-coded experts of k {}", w.in_perm.describe(), w.n_experts, w.k);
  const int64_t K = w.k, rb = q8_row_bytes(K), r1 = p.offsets[w.n_experts];
  if (static_cast<int64_t>(buf.size()) < r1 * rb) buf.resize(static_cast<size_t>(r1 * rb));
  const char* a = static_cast<const char*>(p.a);
  char* out = buf.data();
  const int32_t* perms = w.in_perm.data<int32_t>();
  const int64_t* off = p.offsets;
  const int64_t E = w.n_experts;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && (r1 - off[0]) * K >= (int64_t{1} << 18))
  for (int64_t r = off[0]; r < r1; ++r) {
    const int64_t e = std::upper_bound(off, off + E + 1, r) - off - 1;
    const int32_t* perm = perms + e * K;
    const char* src = a + r * p.lda;
    char* dst = out + r * rb;
    for (int64_t j = 0; j < K; ++j) dst[j] = src[perm[j]];
    std::memcpy(dst + K, src + K, static_cast<size_t>(rb - K));
  }
  GroupedGemmParams q = p;
  q.a = out;
  q.lda = rb;
  return q;
}

gg::Job make_job(const GroupedGemmParams& p) {
  const PackedExperts& w = *p.w;
  gg::Job j;
  const int64_t es = dtype_size(w.dtype);
  j.w = static_cast<const char*>(w.data.raw());
  j.expert_stride = w.expert_stride * es;
  j.panel_stride = gg::panel_elems(w.k, w.dtype) * es;
  if (w.dtype == DType::F8E4M3) {
    j.f8_scale = w.w_scale.data<float>();
    j.f8_n_kb = w.k / w.block_k;
    j.f8_kb_pairs = w.block_k / 2;
    j.f8_scale_stride = gg::n_panels(w.n, w.gated) * j.f8_n_kb * 2 * kPanel;
  }
  j.k = w.k;
  j.n_out = w.n_out();
  j.gated = w.gated;
  j.act = p.act;
  j.a = static_cast<const char*>(p.a);
  j.lda_bytes = p.lda * dtype_size(w.act_dtype());
  j.offsets = p.offsets;
  j.c = static_cast<char*>(p.c);
  j.ldc_bytes = p.ldc * dtype_size(p.c_dtype);
  j.c_dtype = p.c_dtype;
  j.col_windows = w.dtype == DType::F32 && !w.gated && p.c_dtype == DType::F32;
  if (w.dtype == DType::I8) {
    j.w_scale = w.w_scale.data<float>();
    j.w_comp = w.w_comp.data<int32_t>();
    j.q_stride = gg::n_panels(w.n, w.gated) * kPanel;
    j.a_scale_off = q8_scale_offset(w.k);
    if (w.int4_group > 0) gg::fill_job_i4(w, j);
  }
  return j;
}

using Runner = void (*)(const gg::Job&, const gg::Task&);

Runner pick_runner(const PackedExperts& w) {
  const DType wt = w.dtype;
  const Isa isa = active_isa();
  // AMX runners: prefill tasks on tiles, decode tasks handed to the VNNI runners.
  if (w.int4_group > 0 && w.code_bits == 6) {
    if (isa >= Isa::Amx) return gg::run_task_amx_g6;
    if (isa >= Isa::Avx512 && cpu_features().avx512_vnni) return gg::run_task_avx512_vnni_g6;
    return isa >= Isa::Avx2 ? gg::run_task_avx2_g6 : gg::run_task_portable_g6;
  }
  if (w.int4_group > 0 && w.code_bits == 8) {
    if (isa >= Isa::Amx) return gg::run_task_amx_g8;
    if (isa >= Isa::Avx512 && cpu_features().avx512_vnni) return gg::run_task_avx512_vnni_g8;
    return isa >= Isa::Avx2 ? gg::run_task_avx2_g8 : gg::run_task_portable_g8;
  }
  if (w.int4_group > 0) {
    if (isa >= Isa::Amx) return gg::run_task_amx_i4;
    if (isa >= Isa::Avx512 && cpu_features().avx512_vnni) return gg::run_task_avx512_vnni_i4;
    return isa >= Isa::Avx2 ? gg::run_task_avx2_i4 : gg::run_task_portable_i4;
  }
  if (wt == DType::F8E4M3) return gg::run_task_f8;
  if (wt == DType::I8) {
    if (isa >= Isa::Avx512 && cpu_features().avx512_vnni) return gg::run_task_avx512_vnni_i8;
    return isa >= Isa::Avx2 ? gg::run_task_avx2_i8 : gg::run_task_portable_i8;
  }
  if (wt == DType::BF16) {
    switch (isa) {
      case Isa::Amx: return gg::amx_bf16_fits(w.k) ? gg::run_task_amx_bf16 : gg::run_task_avx512bf16;
      case Isa::Avx512Bf16: return gg::run_task_avx512bf16;
      case Isa::Avx512: return gg::run_task_avx512_bf16emu;
      case Isa::Avx2: return gg::run_task_avx2_bf16;
      case Isa::Portable: return gg::run_task_portable_bf16;
    }
  }
  switch (isa) {
    case Isa::Amx:
    case Isa::Avx512Bf16:
    case Isa::Avx512: return gg::run_task_avx512_f32;
    case Isa::Avx2: return gg::run_task_avx2_f32;
    case Isa::Portable: break;
  }
  return gg::run_task_portable_f32;
}

// Decode experts (<= gg::kDecodeMaxRows rows): each task covers several panels so it
// streams ~kDecodeTaskBytes of weights in one go (amortises the scheduling and lets the
// hardware prefetcher lock on to one long stream per thread).
using gg::kDecodeMaxRows;
constexpr int64_t kDecodeTaskBytes = 1 << 20;

void build_tasks(const gg::Job& j, int64_t n_experts, int64_t np, int nt, std::vector<gg::Task>& tasks) {
  tasks.clear();
  int64_t decode_panels = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t rows = j.offsets[e + 1] - j.offsets[e];
    if (rows > 0 && rows <= kDecodeMaxRows) decode_panels += np;
  }
  // Panels per decode task: ~kDecodeTaskBytes, but at least ~8 tasks per thread for balance.
  int64_t g = std::max<int64_t>(1, kDecodeTaskBytes / std::max<int64_t>(1, j.panel_stride));
  g = std::min(g, std::max<int64_t>(1, decode_panels / (8 * nt)));
  // Prefill tasks are one panel each, except int4's: each task sums its rows' activations
  // per group (the zero-point term) before its panels, so an int4 task takes 4 panels
  // (with 64-column panels of K = 2048, 256 KiB of weights: L2 holds them across the row
  // blocks), which divides that work by 4 and still leaves an expert's 2 x 12..16 panels
  // in 6..8 tasks. A GEMM of few panels on a large team takes 2 or 1 a task, down to 2
  // tasks a thread: o_proj's 32 panels made 8 tasks, so 8 of 16 threads worked and it
  // scaled 5.4x from 1 to 16 threads (the experts 14.7x). The sums are per row and group,
  // integers, so a task's extent changes no bit.
  int64_t prefill_panels = 0;
  for (int64_t e = 0; e < n_experts; ++e)
    if (j.offsets[e + 1] - j.offsets[e] > kDecodeMaxRows) prefill_panels += np;
  int64_t prefill_step = j.i4_n_groups > 0 ? 4 : 1;
  while (prefill_step > 1 && prefill_panels < 2 * nt * prefill_step) prefill_step /= 2;
  int64_t panels = 0;  // of experts with rows
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t rows = j.offsets[e + 1] - j.offsets[e];
    if (rows == 0) continue;
    panels += np;
    const int64_t step = rows <= kDecodeMaxRows ? g : prefill_step;
    for (int64_t P = 0; P < np; P += step)
      tasks.push_back({static_cast<int32_t>(e), static_cast<int32_t>(P), static_cast<int32_t>(std::min(np, P + step))});
  }
  // A decode GEMM of fewer panels than threads: the router (2048 x 128 f32, 1 MiB a layer)
  // ran as 2 tasks whatever the team, 0.12-0.17 ms of a 1.5-2.1 ms decode step on 16
  // threads. Windows of 32 columns, or 16 when that is still too few tasks, spread it. A
  // window reads the 64- or 128-byte pieces of its columns from each 256-byte k step, a
  // strided stream that one core reads slower than a whole panel, so windows are made only
  // when the team outnumbers the panels: on 16 threads `generate --profile`'s route fell to
  // 0.11-0.13 ms a step (docs/PERF.md, tenth session).
  if (!j.col_windows || decode_panels != panels || panels >= nt) return;
  const int per = panels * 2 >= nt ? 2 : 1;  // 16-column chunks per window
  tasks.clear();
  for (int64_t e = 0; e < n_experts; ++e) {
    if (j.offsets[e + 1] == j.offsets[e]) continue;
    for (int64_t P = 0; P < np; ++P)
      for (int q = 0; q < gg::kPanelWindows; q += per) {
        gg::Task t{static_cast<int32_t>(e), static_cast<int32_t>(P), static_cast<int32_t>(P + 1),
                   static_cast<int8_t>(q), static_cast<int8_t>(q + per)};
        if (gg::window_cols(j, t) > 0) tasks.push_back(t);
      }
  }
}

}  // namespace

void grouped_gemm(const GroupedGemmParams& p) { grouped_gemm_many({&p, 1}); }

int64_t grouped_gemm_task_count(const GroupedGemmParams& p, int threads) {
  check_params(p);
  std::vector<gg::Task> tasks;
  build_tasks(make_job(p), p.w->n_experts, gg::n_panels(p.w->n, p.w->gated), threads, tasks);
  return static_cast<int64_t>(tasks.size());
}

void grouped_gemm_many(std::span<const GroupedGemmParams> ps) {
  // Act-order weights (in_perm) first, each on its own: their rows are gathered into
  // input order, then run as a plain weight (before the scratch below is laid out, which
  // that call reuses).
  auto gathers = [](const GroupedGemmParams& p) {
    return p.w->in_perm.defined() && p.offsets[p.w->n_experts] > p.offsets[0];
  };
  for (const GroupedGemmParams& p : ps) {
    check_params(p);
    if (!gathers(p)) continue;
    thread_local std::vector<char> gathered;
    GroupedGemmParams q = gather_in_perm(p, gathered);
    PackedExperts plain = *p.w;  // shares the storage; the gathered rows need no permutation
    plain.in_perm = Tensor();
    q.w = &plain;
    grouped_gemm_many({&q, 1});
  }
  // The others' tasks, each GEMM's as it alone would have them (so the same bits), run in
  // one team: all[i] is a task of ones[owner[i]].
  struct One {
    gg::Job job;
    Runner run;
  };
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  thread_local std::vector<One> ones;
  thread_local std::vector<gg::Task> tasks, all;
  thread_local std::vector<int> owner;
  ones.clear();
  all.clear();
  owner.clear();
  int64_t macs = 0;
  for (const GroupedGemmParams& p : ps) {
    if (gathers(p)) continue;
    const PackedExperts& w = *p.w;
    ones.push_back({make_job(p), pick_runner(w)});
    build_tasks(ones.back().job, w.n_experts, gg::n_panels(w.n, w.gated), nt, tasks);
    all.insert(all.end(), tasks.begin(), tasks.end());
    owner.insert(owner.end(), tasks.size(), static_cast<int>(ones.size() - 1));
    macs += (p.offsets[w.n_experts] - p.offsets[0]) * w.n * w.k;
  }
  const int64_t n_tasks = static_cast<int64_t>(all.size());
  const One* o = ones.data();
  const int* ow = owner.data();
  const gg::Task* tk = all.data();
  // Below ~2^18 multiply-adds (tens of microseconds on one core) waking a team
  // costs more than it saves, and on a loaded machine a descheduled team member
  // stalls everyone at the barrier.
  if (nt == 1 || n_tasks <= 1 || macs < (int64_t{1} << 18)) {
    for (int64_t i = 0; i < n_tasks; ++i) o[ow[i]].run(o[ow[i]].job, tk[i]);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t i = 0; i < n_tasks; ++i) o[ow[i]].run(o[ow[i]].job, tk[i]);
}

void grouped_gemm_reference(const GroupedGemmParams& p) {
  check_params(p);
  if (p.w->in_perm.defined() && p.offsets[p.w->n_experts] > p.offsets[0]) {
    std::vector<char> gathered;
    GroupedGemmParams q = gather_in_perm(p, gathered);
    PackedExperts plain = *p.w;
    plain.in_perm = Tensor();
    q.w = &plain;
    return grouped_gemm_reference(q);
  }
  const PackedExperts& w = *p.w;
  if (w.int4_group > 0) return gg::reference_i4(p);
  if (w.dtype == DType::I8) return gg::reference_i8(p);
  const int64_t K = w.k, N = w.n, n_out = w.n_out();
  std::vector<float> arow(K), acc(N);
  for (int64_t e = 0; e < w.n_experts; ++e) {
    const int64_t r0 = p.offsets[e], r1 = p.offsets[e + 1];
    if (r0 == r1) continue;
    const Tensor we = unpack_expert(w, e);
    const float* W = we.data<float>();
    for (int64_t r = r0; r < r1; ++r) {
      const char* a = static_cast<const char*>(p.a) + r * p.lda * dtype_size(w.act_dtype());
      convert_to_f32(a, w.act_dtype(), arow.data(), K);
      for (int64_t n = 0; n < N; ++n) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k) s += arow[k] * W[n * K + k];
        acc[n] = s;
      }
      float* out = acc.data();
      if (w.gated)
        for (int64_t c = 0; c < n_out; ++c) out[c] = act_gate(p.act, acc[c]) * acc[n_out + c];
      char* crow = static_cast<char*>(p.c) + r * p.ldc * dtype_size(p.c_dtype);
      convert_from_f32(out, crow, p.c_dtype, n_out);
    }
  }
}

namespace gg {
void run_task_portable_f32(const Job& j, const Task& t) { generic_run_task<float>(j, t); }
void run_task_portable_bf16(const Job& j, const Task& t) { generic_run_task<uint16_t>(j, t); }
}  // namespace gg

}  // namespace moe
