#include "model/attention_kernels.h"

#include <cmath>

#include "core/cpu.h"
#include "model/attention_mla_impl.h"

namespace moe {

void gqa_attend_avx512(const GqaAttendArgs& a);  // attention_kernels_avx512.cpp
void gqa_attend_avx2(const GqaAttendArgs& a);    // attention_kernels_avx2.cpp
void mla_attend_avx512(const MlaAttendArgs& a);
void mla_attend_avx2(const MlaAttendArgs& a);

void mla_attend(const MlaAttendArgs& a) {
  if (a.tc == 0) return;
  if (active_isa() >= Isa::Avx512) mla_attend_avx512(a);
  else if (active_isa() == Isa::Avx2) mla_attend_avx2(a);
  else attn_impl::mla_attend(a);
}

void gqa_attend(const GqaAttendArgs& a) {
  if (a.batch->n_tokens() == 0) return;
  MOE_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0 && a.head_dim > 0, "gqa_attend: {} heads over {} KV heads of {}",
            a.n_heads, a.n_kv, a.head_dim);
  if (active_isa() >= Isa::Avx512) gqa_attend_avx512(a);
  else if (active_isa() == Isa::Avx2) gqa_attend_avx2(a);
  else attn_impl::gqa_attend(a);
}

// The definition of model/attention_math.h, one query row and head at a time.
void gqa_attend_reference(const GqaAttendArgs& a) {
  using namespace attn_math;
  const StepBatch& b = *a.batch;
  const int64_t hd = a.head_dim, ldq = a.n_heads * hd, group = a.n_heads / a.n_kv;
  const KvCache& cache = *a.cache;
  std::vector<float> sc(kChunk), kbuf(cache.a_dim()), vbuf(cache.b_dim()), ob(hd), so(hd), ro(hd);
  for (const SeqSpan& sp : b.seqs)
    for (int64_t t = sp.first; t < sp.first + sp.n; ++t)
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const int64_t n_ctx = b.positions[t] + 1, kvh = h / group;
        const float* qh = a.q + t * ldq + h * hd;
        State R;
        R.o = ro.data();
        for (int64_t s0 = 0; s0 < n_ctx; s0 += kSpan) {
          State S;
          S.o = so.data();
          for (int64_t c0 = s0; c0 < std::min(s0 + kSpan, n_ctx); c0 += kChunk) {
            const int64_t jn = std::min(c0 + kChunk, n_ctx) - c0;
            for (int64_t j = 0; j < jn; ++j) {
              const float* k = cache.row_a(a.layer, sp.slot, c0 + j, kbuf.data()) + kvh * hd;
              float s = 0.f;
              for (int64_t d = 0; d < hd; ++d) s = fmadd(qh[d], k[d], s);
              sc[j] = s * a.scale;
            }
            float m = sc[0];
            for (int64_t j = 1; j < jn; ++j) m = std::max(m, sc[j]);
            float lanes[kLanes] = {};
            for (int64_t j = 0; j < (jn + kLanes - 1) / kLanes * kLanes; ++j) {
              const float p = j < jn ? exp_neg(sc[j] - m) : 0.f;
              if (j < jn) sc[j] = p;
              lanes[j % kLanes] = lanes[j % kLanes] + p;
            }
            const float l = lane_sum(lanes);
            std::fill(ob.begin(), ob.end(), 0.f);
            for (int64_t j = 0; j < jn; ++j) {
              const float* v = cache.row_b(a.layer, sp.slot, c0 + j, vbuf.data()) + kvh * hd;
              for (int64_t d = 0; d < hd; ++d) ob[d] = fmadd(sc[j], v[d], ob[d]);
            }
            fold(S, m, l, ob.data(), hd);
          }
          fold(R, S.m, S.l, S.o, hd);
        }
        float* o = a.ctx + t * ldq + h * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = R.o[d] / R.l;
      }
}

// The definition of mla_attend (model/attention_kernels.h), one head of one token at a time.
void mla_attend_reference(const MlaAttendArgs& a) {
  using namespace attn_math;
  const StepBatch& b = *a.batch;
  const KvCache& cache = *a.cache;
  const int64_t L = cache.a_dim(), R = cache.b_dim();
  std::vector<float> ca(L), cb(R), sc(kChunk), ob(L), so(L), ro(L);
  for (const SeqSpan& sp : b.seqs)
    for (int64_t t = std::max(sp.first, a.t0); t < std::min(sp.first + sp.n, a.t0 + a.tc); ++t)
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const int64_t i = t - a.t0, n_ctx = b.positions[t] + 1;
        const float* ql = a.q_lat + (h * a.tc + i) * L;
        const float* qp = a.q_pe + t * a.pe_ld_t + h * a.pe_ld_h;
        State res, span;
        res.o = ro.data();
        span.o = so.data();
        for (int64_t c0 = 0; c0 < n_ctx; c0 += kChunk) {
          if (c0 % kSpan == 0) span.empty = true;
          const int64_t jn = std::min(c0 + kChunk, n_ctx) - c0;
          for (int64_t j = 0; j < jn; ++j) {
            const float* c = cache.row_a(a.layer, sp.slot, c0 + j, ca.data());
            const float* k = cache.row_b(a.layer, sp.slot, c0 + j, cb.data());
            float s = 0.f;
            for (int64_t d = 0; d < L; ++d) s = fmadd(ql[d], c[d], s);
            for (int64_t r = 0; r < R; ++r) s = fmadd(qp[r], k[r], s);
            sc[j] = s * a.scale;
          }
          float m = sc[0], l = 0.f;
          for (int64_t j = 1; j < jn; ++j) m = std::max(m, sc[j]);
          for (int64_t j = 0; j < jn; ++j) l = l + (sc[j] = exp_neg(sc[j] - m));
          std::fill(ob.begin(), ob.end(), 0.f);
          for (int64_t j = 0; j < jn; ++j) {
            const float* c = cache.row_a(a.layer, sp.slot, c0 + j, ca.data());
            for (int64_t d = 0; d < L; ++d) ob[d] = fmadd(sc[j], c[d], ob[d]);
          }
          fold(span, m, l, ob.data(), L);
          const int64_t span_end = std::min((c0 / kSpan + 1) * kSpan, n_ctx);
          if (c0 + kChunk >= span_end) fold(res, span.m, span.l, span.o, L);  // the span's last chunk
        }
        float* o = a.o_lat + (h * a.tc + i) * L;
        for (int64_t d = 0; d < L; ++d) o[d] = res.o[d] / res.l;
      }
}

}  // namespace moe
