#include "model/attention_kernels.h"

#include "core/cpu.h"
#include "model/attention_kernels_impl.h"

namespace moe {

void gqa_attend_avx512(const GqaAttendArgs& a);  // attention_kernels_avx512.cpp
void gqa_attend_avx2(const GqaAttendArgs& a);    // attention_kernels_avx2.cpp

void gqa_attend(const GqaAttendArgs& a) {
  if (a.batch->n_tokens() == 0) return;
  if (active_isa() >= Isa::Avx512) gqa_attend_avx512(a);
  else if (active_isa() == Isa::Avx2) gqa_attend_avx2(a);
  else attn_impl::gqa_attend(a);
}

void softmax_inplace(float* sc, int64_t n) { attn_impl::softmax_row(sc, n); }

void gqa_attend_reference(const GqaAttendArgs& a) {
  const StepBatch& b = *a.batch;
  const int64_t hd = a.head_dim, ldq = a.n_heads * hd, group = a.n_heads / a.n_kv;
  const KvCache& cache = *a.cache;
  std::vector<float> sc(cache.max_seq()), kbuf(cache.a_dim()), vbuf(cache.b_dim());
  for (const SeqSpan& sp : b.seqs)
    for (int64_t t = sp.first; t < sp.first + sp.n; ++t)
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const int64_t n_ctx = b.positions[t] + 1, kvh = h / group;
        const float* qh = a.q + t * ldq + h * hd;
        for (int64_t j = 0; j < n_ctx; ++j) {
          const float* k = cache.row_a(a.layer, sp.slot, j, kbuf.data()) + kvh * hd;
          float s = 0.f;
          for (int64_t d = 0; d < hd; ++d) s += qh[d] * k[d];
          sc[j] = s * a.scale;
        }
        attn_impl::softmax_row(sc.data(), n_ctx);
        float* o = a.ctx + t * ldq + h * hd;
        std::fill(o, o + hd, 0.f);
        for (int64_t j = 0; j < n_ctx; ++j) {
          const float* v = cache.row_b(a.layer, sp.slot, j, vbuf.data()) + kvh * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] += sc[j] * v[d];
        }
      }
}

}  // namespace moe
