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
// peak on Zen 3; docs/PERF.md.) Softmax, the chunk fold and the final division are lane
// by lane, in the order of the definition (mla_attend_reference), so every head's result
// has the same bits whatever the batch, the chunking of a prompt, the thread count or
// the ISA.
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
// registers), folded into the result state ro[d]: taken as they are for the first chunk,
// else ro * fa + o * fb (attn_math::fold). (Returning the sums through an array made GCC
// keep the accumulators on the stack: every multiply-add a store, 50 % slower.)
struct MlaFold {
  bool first;
  v16 fa, fb;
};
template <int J>
inline void mla_vsum(const float* p, int64_t jn, const float* cf, int64_t D, int64_t d0, const MlaFold& f,
                     float* ro) {
  v16 o[J];
  for (int k = 0; k < J; ++k) o[k] = v16{};
  for (int64_t j = 0; j < jn; ++j) {
    const v16 pj = load(p + j * kLanes);
    const float* c = cf + j * D + d0;
    for (int k = 0; k < J; ++k) o[k] = attn_math::fmadd(c[k], pj, o[k]);
  }
  for (int k = 0; k < J; ++k) {
    float* r = ro + (d0 + k) * kLanes;
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
                       float* ro) {
  if constexpr (J > 0) {
    if (n == J) return mla_vsum<J>(p, jn, cf, D, d0, f, ro);
    mla_vsum_n<J - 1>(n, p, jn, cf, D, d0, f, ro);
  }
}

// One item: token i of the chunk [a.t0, a.t0 + a.tc), heads [h0, h0 + 16) (lanes past
// n_heads score a zero query and are not written).
template <class E>
inline void mla_item(const MlaAttendArgs& a, int64_t slot, int64_t i, int64_t h0, MlaScratch& s) {
  const KvCache& cache = *a.cache;
  const int64_t L = cache.a_dim(), R = cache.b_dim(), D = L + R, t = a.t0 + i;
  const int64_t n_ctx = a.batch->positions[t] + 1, nh = std::min<int64_t>(kLanes, a.n_heads - h0);
  s.qt.assign(D * kLanes, 0.f);
  for (int64_t g = 0; g < nh; ++g) {
    const float* ql = a.q_lat + ((h0 + g) * a.tc + i) * L;
    const float* qp = a.q_pe + t * a.pe_ld_t + (h0 + g) * a.pe_ld_h;
    for (int64_t d = 0; d < L; ++d) s.qt[d * kLanes + g] = ql[d];
    for (int64_t r = 0; r < R; ++r) s.qt[(L + r) * kLanes + g] = qp[r];
  }
  s.cf.resize(kChunk * D);
  s.p.resize(kChunk * kLanes);
  s.ro.resize(L * kLanes);
  v16 rm = v16{}, rl = v16{};
  for (int64_t c0 = 0; c0 < n_ctx; c0 += kChunk) {
    const int64_t jn = std::min(kChunk, n_ctx - c0);
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
    // fold (attn_math::fold) of (m, l, o) into the result, lane by lane.
    MlaFold f{c0 == 0, v16{}, v16{}};
    if (f.first) {
      rm = m;
      rl = l;
    } else {
      const v16 mn = sel(m > rm, m, rm);
      f.fa = exp_neg(rm - mn);
      f.fb = exp_neg(m - mn);
      rl = rl * f.fa + l * f.fb;
      rm = mn;
    }
    for (int64_t d0 = 0; d0 < L; d0 += kMlaBlock)
      mla_vsum_n(static_cast<int>(std::min<int64_t>(kMlaBlock, L - d0)), p, jn, s.cf.data(), D, d0, f, s.ro.data());
  }
  // o / l (a vector division: one scalar vdivss per head and dim took 8 % of the kernel).
  float* ro = s.ro.data();
  for (int64_t d = 0; d < L; ++d) store(ro + d * kLanes, load(ro + d * kLanes) / rl);
  for (int64_t g = 0; g < nh; ++g) {
    float* out = a.o_lat + ((h0 + g) * a.tc + i) * L;
    for (int64_t d = 0; d < L; ++d) out[d] = ro[d * kLanes + g];
  }
}

inline void mla_attend(const MlaAttendArgs& a) {
  const StepBatch& b = *a.batch;
  std::vector<int64_t> slot(a.tc);
  int64_t work = 0;
  for (const SeqSpan& sp : b.seqs)
    for (int64_t t = std::max(sp.first, a.t0); t < std::min(sp.first + sp.n, a.t0 + a.tc); ++t) {
      slot[t - a.t0] = sp.slot;
      work += b.positions[t] + 1;
    }
  const int64_t hb = (a.n_heads + kLanes - 1) / kLanes, items = a.tc * hb;
  const bool bf16 = a.cache->dtype() == DType::BF16;
  work *= hb * kLanes * (a.cache->a_dim() + a.cache->b_dim());
  // Small steps on one thread: waking a team costs more than ~2^18 multiply-adds.
#pragma omp parallel if (items > 1 && work >= (int64_t{1} << 18))
  {
    MlaScratch s;
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t i = it / hb, h0 = it % hb * kLanes;
      if (bf16)
        mla_item<uint16_t>(a, slot[i], i, h0, s);
      else
        mla_item<float>(a, slot[i], i, h0, s);
    }
  }
}

}  // namespace
}  // namespace moe::attn_impl
