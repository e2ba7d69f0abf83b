// Private to attention_kernels*.cpp: the blocked GQA attention body, compiled once
// for the baseline ISA, once with AVX2 and once with AVX-512 (GCC vector extensions: the
// same element-wise multiplies and adds either way, so the same bits). A bf16 cache is
// widened to f32 in plain C++ as it is read (keys into the tile, V rows into a buffer):
// widening is exact, so the bits equal the f32 code run on the bf16-rounded values.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/attention_kernels.h"

// Internal linkage: each including file (one per ISA) gets its own copy, so the linker
// never mixes an AVX-512 instance into the portable build.
namespace moe::attn_impl {
namespace {

// v16 values never cross a call boundary that is not inlined in the same file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

constexpr int kLanes = 16;  // keys per score vector
constexpr int kQBlock = 8;  // new tokens of a sequence per work item
typedef float v16 __attribute__((vector_size(kLanes * sizeof(float))));

inline v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

// Softmax of sc[0..n) in place: f32, max-subtracted, sequential sum (as torch.softmax).
inline void softmax_row(float* sc, int64_t n) {
  float mx = sc[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, sc[j]);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    sc[j] = std::exp(sc[j] - mx);
    sum += sc[j];
  }
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) sc[j] *= inv;
}

struct Item {
  int32_t seq;
  int32_t kvh;
  int64_t t0, nt;  // tokens [t0, t0 + nt) of the step
};

struct Scratch {
  std::vector<float> tile;  // [head_dim][kLanes]
  std::vector<float> sc;    // [rows][ld]
  std::vector<float> vrow;  // [head_dim]: a V row widened to f32 (bf16 cache)
};

// The V row of position j as f32: the cache's own row (f32), or widened into buf once
// per position, then used by every query of the item (plain C++: the loop vectorises
// for whichever ISA this file is compiled for).
template <class E>
inline const float* v_row(const KvCache& cache, int64_t layer, int64_t slot, int64_t j, int64_t off, int64_t hd,
                          float* buf) {
  const E* v = cache.b_row<E>(layer, slot, j) + off;
  if constexpr (std::is_same_v<E, float>) {
    return v;
  } else {
    for (int64_t d = 0; d < hd; ++d) buf[d] = kv_widen(v[d]);
    return buf;
  }
}

// E: the cache's element type, float (f32) or uint16_t (bf16 bits).
template <class E>
inline void attend_item(const GqaAttendArgs& a, const Item& it, Scratch& s) {
  const StepBatch& b = *a.batch;
  const SeqSpan& sp = b.seqs[it.seq];
  const KvCache& cache = *a.cache;
  const int64_t hd = a.head_dim, G = a.n_heads / a.n_kv, ldq = a.n_heads * hd, kvh = it.kvh;
  int64_t max_ctx = 0;
  for (int64_t t = it.t0; t < it.t0 + it.nt; ++t) max_ctx = std::max<int64_t>(max_ctx, b.positions[t] + 1);
  const int64_t ld = (max_ctx + kLanes - 1) / kLanes * kLanes, rows = it.nt * G;
  if (static_cast<int64_t>(s.sc.size()) < rows * ld) s.sc.resize(rows * ld);
  if (static_cast<int64_t>(s.tile.size()) < hd * kLanes) s.tile.resize(hd * kLanes);
  if (static_cast<int64_t>(s.vrow.size()) < hd) s.vrow.resize(hd);
  float* tile = s.tile.data();
  float* vbuf = s.vrow.data();
  float* sc = s.sc.data();
  const v16 vscale = v16{} + a.scale;

  // Scores, 16 keys at a time: lane l of a row's vector is dot(q, k_{j0+l}) summed over d in order.
  for (int64_t j0 = 0; j0 < max_ctx; j0 += kLanes) {
    const int64_t jn = std::min<int64_t>(kLanes, max_ctx - j0);
    for (int64_t l = 0; l < kLanes; ++l) {
      if (l < jn) {
        const E* k = cache.a_row<E>(a.layer, sp.slot, j0 + l) + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) tile[d * kLanes + l] = kv_widen(k[d]);
      } else {
        for (int64_t d = 0; d < hd; ++d) tile[d * kLanes + l] = 0.f;
      }
    }
    for (int64_t t = 0; t < it.nt; ++t) {
      if (j0 > b.positions[it.t0 + t]) continue;  // the whole tile is after this token
      const float* qt = a.q + (it.t0 + t) * ldq + kvh * G * hd;
      int64_t g = 0;
      for (; g + 2 <= G; g += 2) {  // two heads per pass: two independent chains
        const float* q0 = qt + g * hd;
        const float* q1 = q0 + hd;
        v16 acc0 = v16{}, acc1 = v16{};
        for (int64_t d = 0; d < hd; ++d) {
          const v16 k = load(tile + d * kLanes);
          acc0 = acc0 + q0[d] * k;
          acc1 = acc1 + q1[d] * k;
        }
        store(sc + (t * G + g) * ld + j0, acc0 * vscale);
        store(sc + (t * G + g + 1) * ld + j0, acc1 * vscale);
      }
      for (; g < G; ++g) {
        const float* q0 = qt + g * hd;
        v16 acc0 = v16{};
        for (int64_t d = 0; d < hd; ++d) acc0 = acc0 + q0[d] * load(tile + d * kLanes);
        store(sc + (t * G + g) * ld + j0, acc0 * vscale);
      }
    }
  }
  for (int64_t t = 0; t < it.nt; ++t)
    for (int64_t g = 0; g < G; ++g) softmax_row(sc + (t * G + g) * ld, b.positions[it.t0 + t] + 1);

  // Output: o[d] = sum over j in order of p_j * v_j[d]; 16 dims per vector.
  for (int64_t t = 0; t < it.nt; ++t)
    for (int64_t g = 0; g < G; ++g) std::fill_n(a.ctx + (it.t0 + t) * ldq + (kvh * G + g) * hd, hd, 0.f);
  if (hd % kLanes == 0) {
    for (int64_t j = 0; j < max_ctx; ++j) {
      const float* v = v_row<E>(cache, a.layer, sp.slot, j, kvh * hd, hd, vbuf);
      for (int64_t t = 0; t < it.nt; ++t) {
        if (j > b.positions[it.t0 + t]) continue;
        for (int64_t g = 0; g < G; ++g) {
          const float p = sc[(t * G + g) * ld + j];
          float* o = a.ctx + (it.t0 + t) * ldq + (kvh * G + g) * hd;
          for (int64_t d = 0; d < hd; d += kLanes) store(o + d, load(o + d) + p * load(v + d));
        }
      }
    }
  } else {
    for (int64_t j = 0; j < max_ctx; ++j) {
      const float* v = v_row<E>(cache, a.layer, sp.slot, j, kvh * hd, hd, vbuf);
      for (int64_t t = 0; t < it.nt; ++t) {
        if (j > b.positions[it.t0 + t]) continue;
        for (int64_t g = 0; g < G; ++g) {
          const float p = sc[(t * G + g) * ld + j];
          float* o = a.ctx + (it.t0 + t) * ldq + (kvh * G + g) * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] += p * v[d];
        }
      }
    }
  }
}

inline void gqa_attend(const GqaAttendArgs& a) {
  const StepBatch& b = *a.batch;
  thread_local std::vector<Item> items;  // reused: no allocation per layer and step
  items.clear();
  int64_t work = 0;  // multiply-adds, roughly
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const SeqSpan& sp = b.seqs[s];
    for (int64_t t0 = 0; t0 < sp.n; t0 += kQBlock)
      for (int64_t h = 0; h < a.n_kv; ++h)
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h), sp.first + t0,
                         std::min<int64_t>(kQBlock, sp.n - t0)});
    work += sp.n * (sp.start_pos + sp.n) * a.n_heads * a.head_dim;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  const Item* list = items.data();  // the caller's: in the team, `items` names each thread's own
  const bool bf16 = a.cache->dtype() == DType::BF16;
  // Small steps run on one thread: waking a team costs more than the work.
#pragma omp parallel if (n > 1 && work >= (int64_t{1} << 17))
  {
    static thread_local Scratch s;
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < n; ++i) {
      if (bf16) attend_item<uint16_t>(a, list[i], s);
      else attend_item<float>(a, list[i], s);
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace
}  // namespace moe::attn_impl
