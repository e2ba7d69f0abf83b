// Private to attention_kernels*.cpp: MLA's attention in the latent space (model/
// attention_kernels.h mla_attend), compiled per ISA like the GQA body it builds on
// (model/attention_kernels_impl.h: v16, load, store; model/attention_math.h: exp_neg,
// fold).
//
// In the latent space MLA is multi-query attention: every query head scores the same
// cached rows [c_kv | k_pe] (kv_lora + rope dims, 576 for DeepSeek-V3) and sums the same
// c_kv rows. So the heads go in the vector lanes, 16 heads of one token per work item,
// and every cached value is loaded once and broadcast against the 16 heads:
//   scores: kMlaBlock keys x 16 heads of accumulators, one multiply-add per dim;
//   V sums: kMlaBlock dims x 16 heads of accumulators, one multiply-add per key.
// Each is a broadcast of one cached value and one fused multiply-add per 16 heads, from a
// chunk's rows widened to f32 once per item. (One head at a time, each score loaded its
// query and its row for every multiply-add, and each of the 128 heads re-read the whole
// cache: a 2048-token prefill of a DeepSeek-V3-attention GGUF ran at a quarter of the FMA
// peak on Zen 3; docs/PERF.md.) Softmax, the chunk and span folds and the final division
// are lane by lane, in the order of the definition (mla_attend_reference), so every
// head's result has the same bits whatever the batch, the chunking of a prompt, the
// thread count or the ISA. A call with under 2 items a thread (a decode step: 8 items for
// 128 heads) splits each token's context into one item per span, and a merge folds the
// spans' states in order, as the GQA kernel does.
#pragma once

#include <omp.h>

#include <vector>

#include "model/attention_kernels_impl.h"

namespace moe::attn_impl {
namespace {

// Keys per score pass and dims per V pass: kMlaBlock accumulators of 16 heads, plus the
// loaded query (or probability) vector and the broadcast, must stay in registers. AVX2: a
// v16 is 2 ymm, 6 of them 12 of the 16 ymm; AVX-512 uses the same blocks (6 of 32 zmm).
// The blocking never changes the bits (each lane's chain is its own).
constexpr int kMlaBlock = 6;

struct MlaScratch {
  std::vector<float> cf;  // [kChunk][L + R]: the chunk's cached rows [c_kv | k_pe], as f32
  std::vector<float> qt;  // [L + R][16]: the item's queries [q_lat | q_pe], dim-major
  std::vector<float> p;   // [kChunk][16]: scores, then probabilities
  std::vector<float> so;  // [L][16]: the span state's o
  std::vector<float> ro;  // [L][16]: the result state's o
};

// s[j][lane] = scale * (chain over d of qt[d][lane] * cf[j][d]), J keys of D dims.
template <int J>
inline void mla_scores(const float* qt, const float* cf, int64_t D, float scale, float* s) {
  v16 acc[J];
  for (int j = 0; j < J; ++j) acc[j] = v16{};
  for (int64_t d = 0; d < D; ++d) {
    const v16 q = load(qt + d * kLanes);
    for (int j = 0; j < J; ++j) acc[j] = attn_math::fmadd(cf[j * D + d], q, acc[j]);
  }
  for (int j = 0; j < J; ++j) store(s + j * kLanes, acc[j] * scale);
}

// The chunk's V sums of J dims d0.. (chain over j < jn of p[j] * cf[j][d], accumulated in
// registers), folded into the span's state so[d]: taken as they are for the span's first
// chunk, else so * fa + o * fb (attn_math::fold). (Returning the sums through an array made GCC
// keep the accumulators on the stack: every multiply-add a store, 50 % slower.)
struct MlaFold {
  bool first;
  v16 fa, fb;
};
template <int J>
inline void mla_vsum(const float* p, int64_t jn, const float* cf, int64_t D, int64_t d0, const MlaFold& f,
                     float* so) {
  v16 o[J];
  for (int k = 0; k < J; ++k) o[k] = v16{};
  for (int64_t j = 0; j < jn; ++j) {
    const v16 pj = load(p + j * kLanes);
    const float* c = cf + j * D + d0;
    for (int k = 0; k < J; ++k) o[k] = attn_math::fmadd(c[k], pj, o[k]);
  }
  for (int k = 0; k < J; ++k) {
    float* r = so + (d0 + k) * kLanes;
    store(r, f.first ? o[k] : load(r) * f.fa + o[k] * f.fb);
  }
}

// The tails (fewer than kMlaBlock keys or dims) through the same templates.
template <int J = kMlaBlock>
inline void mla_scores_n(int n, const float* qt, const float* cf, int64_t D, float scale, float* s) {
  if constexpr (J > 0) {
    if (n == J) return mla_scores<J>(qt, cf, D, scale, s);
    mla_scores_n<J - 1>(n, qt, cf, D, scale, s);
  }
}
template <int J = kMlaBlock>
inline void mla_vsum_n(int n, const float* p, int64_t jn, const float* cf, int64_t D, int64_t d0, const MlaFold& f,
                       float* so) {
  if constexpr (J > 0) {
    if (n == J) return mla_vsum<J>(p, jn, cf, D, d0, f, so);
    mla_vsum_n<J - 1>(n, p, jn, cf, D, d0, f, so);
  }
}

// A work item: token i of the call's tokens [a.t0, a.t0 + a.tc), heads [h0, h0 + 16),
// spans [span0, span1) of its context; part >= 0: a split item, which leaves its state
// in part (merged in span order afterwards) instead of writing the output.
struct MlaItem {
  int64_t i, h0;
  int32_t span0, span1;
  int64_t part = -1;
};
// A split item's state: m, l, then o [L] (16 lanes each).
inline int64_t mla_part_len(int64_t L) { return (2 + L) * kLanes; }

// R <- R (+) (m, l, o) lane by lane (attn_math::fold): taken as it is when first.
inline void mla_fold(bool first, v16& rm, v16& rl, float* ro, v16 m, v16 l, const float* o, int64_t L) {
  if (first) {
    rm = m;
    rl = l;
    std::copy(o, o + L * kLanes, ro);
    return;
  }
  const v16 mn = sel(m > rm, m, rm);
  const v16 fa = exp_neg(rm - mn), fb = exp_neg(m - mn);
  rl = rl * fa + l * fb;
  for (int64_t d = 0; d < L; ++d) store(ro + d * kLanes, load(ro + d * kLanes) * fa + load(o + d * kLanes) * fb);
  rm = mn;
}

// o / l into o_lat for the item's heads (lanes past n_heads are not written). A vector
// division: one scalar vdivss per head and dim took 8 % of the kernel.
inline void mla_write(const MlaAttendArgs& a, int64_t i, int64_t h0, float* ro, v16 rl, int64_t L) {
  const int64_t nh = std::min<int64_t>(kLanes, a.n_heads - h0);
  for (int64_t d = 0; d < L; ++d) store(ro + d * kLanes, load(ro + d * kLanes) / rl);
  for (int64_t g = 0; g < nh; ++g) {
    float* out = a.o_lat + ((h0 + g) * a.tc + i) * L;
    for (int64_t d = 0; d < L; ++d) out[d] = ro[d * kLanes + g];
  }
}

template <class E>
inline void mla_item(const MlaAttendArgs& a, int64_t slot, const MlaItem& it, MlaScratch& s, float* part) {
  const KvCache& cache = *a.cache;
  const int64_t L = cache.a_dim(), R = cache.b_dim(), D = L + R, t = a.t0 + it.i;
  const int64_t n_ctx = a.batch->positions[t] + 1, nh = std::min<int64_t>(kLanes, a.n_heads - it.h0);
  s.qt.assign(D * kLanes, 0.f);
  for (int64_t g = 0; g < nh; ++g) {
    const float* ql = a.q_lat + ((it.h0 + g) * a.tc + it.i) * L;
    const float* qp = a.q_pe + t * a.pe_ld_t + (it.h0 + g) * a.pe_ld_h;
    for (int64_t d = 0; d < L; ++d) s.qt[d * kLanes + g] = ql[d];
    for (int64_t r = 0; r < R; ++r) s.qt[(L + r) * kLanes + g] = qp[r];
  }
  s.cf.resize(kChunk * D);
  s.p.resize(kChunk * kLanes);
  s.so.resize(L * kLanes);
  s.ro.resize(L * kLanes);
  v16 rm = v16{}, rl = v16{};
  for (int64_t span = it.span0; span < it.span1; ++span) {
    const int64_t sp0 = span * kSpan, sp1 = std::min(sp0 + kSpan, n_ctx);
    if (sp0 >= sp1) break;
    v16 sm = v16{}, sl = v16{};
    for (int64_t c0 = sp0; c0 < sp1; c0 += kChunk) {
      const int64_t jn = std::min(kChunk, sp1 - c0);
      for (int64_t j = 0; j < jn; ++j) {
        const E* ca = cache.a_row<E>(a.layer, slot, c0 + j);
        const E* cb = cache.b_row<E>(a.layer, slot, c0 + j);
        float* row = s.cf.data() + j * D;
        for (int64_t d = 0; d < L; ++d) row[d] = kv_widen(ca[d]);
        for (int64_t r = 0; r < R; ++r) row[L + r] = kv_widen(cb[r]);
      }
      float* p = s.p.data();
      for (int64_t j = 0; j < jn; j += kMlaBlock)
        mla_scores_n(static_cast<int>(std::min<int64_t>(kMlaBlock, jn - j)), s.qt.data(), s.cf.data() + j * D, D,
                     a.scale, p + j * kLanes);
      v16 m = load(p);
      for (int64_t j = 1; j < jn; ++j) {
        const v16 x = load(p + j * kLanes);
        m = sel(x > m, x, m);  // std::max(m, x)
      }
      v16 l = v16{};
      for (int64_t j = 0; j < jn; ++j) {
        const v16 e = exp_neg(load(p + j * kLanes) - m);
        store(p + j * kLanes, e);
        l = l + e;
      }
      // The chunk folded into the span's state (its V sums fold inside the V pass).
      MlaFold f{c0 == sp0, v16{}, v16{}};
      if (f.first) {
        sm = m;
        sl = l;
      } else {
        const v16 mn = sel(m > sm, m, sm);
        f.fa = exp_neg(sm - mn);
        f.fb = exp_neg(m - mn);
        sl = sl * f.fa + l * f.fb;
        sm = mn;
      }
      for (int64_t d0 = 0; d0 < L; d0 += kMlaBlock)
        mla_vsum_n(static_cast<int>(std::min<int64_t>(kMlaBlock, L - d0)), p, jn, s.cf.data(), D, d0, f,
                   s.so.data());
    }
    mla_fold(span == it.span0, rm, rl, s.ro.data(), sm, sl, s.so.data(), L);
  }
  if (part) {
    store(part, rm);
    store(part + kLanes, rl);
    std::copy(s.ro.begin(), s.ro.end(), part + 2 * kLanes);
  } else {
    mla_write(a, it.i, it.h0, s.ro.data(), rl, L);
  }
}

inline void mla_attend(const MlaAttendArgs& a) {
  const StepBatch& b = *a.batch;
  const int64_t L = a.cache->a_dim(), hb = (a.n_heads + kLanes - 1) / kLanes;
  thread_local std::vector<int64_t> slot;
  slot.assign(a.tc, 0);
  int64_t work = 0;
  for (const SeqSpan& sp : b.seqs)
    for (int64_t t = std::max(sp.first, a.t0); t < std::min(sp.first + sp.n, a.t0 + a.tc); ++t) {
      slot[t - a.t0] = sp.slot;
      work += b.positions[t] + 1;
    }
  work *= hb * kLanes * (L + a.cache->b_dim());
  // A token's items split its context by span (merged in order afterwards) when the step
  // has under 2 items a thread: a decode step of DeepSeek-V3 has 8 (128 heads / 16), so a
  // 16-core machine ran its attention on 8 cores. The spans are part of the definition,
  // so the bits do not depend on the split.
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool split = a.schedule == GqaSchedule::split_spans ||
                     (a.schedule == GqaSchedule::automatic && a.tc * hb < 2 * team);
  // Reused: no allocation (and no first touch of fresh pages) per layer and step. Inside
  // the parallel region these names would be each thread's own copies, so it uses the
  // pointers taken below.
  thread_local std::vector<MlaItem> items, merges;  // merges: one per split (token, heads), part = its first span's
  thread_local std::vector<float> parts;            // split items' states: [item][mla_part_len]
  items.clear();
  merges.clear();
  int64_t n_parts = 0;
  for (int64_t i = 0; i < a.tc; ++i) {
    const int32_t n_spans = static_cast<int32_t>((b.positions[a.t0 + i] + kSpan) / kSpan);
    for (int64_t h0 = 0; h0 < a.n_heads; h0 += kLanes) {
      if (!split || n_spans == 1) {
        items.push_back({i, h0, 0, n_spans});
        continue;
      }
      merges.push_back({i, h0, 0, n_spans, n_parts});
      for (int32_t span = 0; span < n_spans; ++span) items.push_back({i, h0, span, span + 1, n_parts++});
    }
  }
  const int64_t part_len = mla_part_len(L), n = static_cast<int64_t>(items.size());
  const int64_t nm = static_cast<int64_t>(merges.size());
  if (static_cast<int64_t>(parts.size()) < n_parts * part_len) parts.resize(n_parts * part_len);
  const MlaItem* list = items.data();
  const MlaItem* mlist = merges.data();
  float* part_base = parts.data();
  const int64_t* slots = slot.data();
  const bool bf16 = a.cache->dtype() == DType::BF16;
  // Small steps on one thread: waking a team costs more than ~2^18 multiply-adds.
#pragma omp parallel if (n > 1 && work >= (int64_t{1} << 18))
  {
    static thread_local MlaScratch s;
#pragma omp for schedule(dynamic)
    for (int64_t k = 0; k < n; ++k) {
      const MlaItem& it = list[k];
      float* part = it.part >= 0 ? part_base + it.part * part_len : nullptr;
      if (bf16)
        mla_item<uint16_t>(a, slots[it.i], it, s, part);
      else
        mla_item<float>(a, slots[it.i], it, s, part);
    }
    // (the loop's barrier: every span's state is written before the merges read them)
#pragma omp for schedule(dynamic)
    for (int64_t k = 0; k < nm; ++k) {
      const MlaItem& m = mlist[k];
      s.ro.resize(L * kLanes);
      v16 rm = v16{}, rl = v16{};
      for (int32_t span = 0; span < m.span1; ++span) {
        const float* pr = part_base + (m.part + span) * part_len;
        mla_fold(span == 0, rm, rl, s.ro.data(), load(pr), load(pr + kLanes), pr + 2 * kLanes, L);
      }
      mla_write(a, m.i, m.h0, s.ro.data(), rl, L);
    }
  }
}

}  // namespace
}  // namespace moe::attn_impl
