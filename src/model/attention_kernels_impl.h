// Private to attention_kernels*.cpp: the GQA attention body (flash attention over the
// KV cache), compiled once for the baseline ISA, once with AVX2 and once with AVX-512
// (GCC vector extensions and explicit FMAs: the same element-wise operations either
// way, so the same bits; model/attention_math.h defines the arithmetic).
//
// Work items: (sequence, KV head, up to kQBlock of the step's new tokens, a range of
// spans, query heads of the KV head's group). Prefill items take every span of their
// tokens and every head of the group (no partial states to keep); a sequence with few
// new tokens (decode) and a long context is split into one item per span, so a single
// conversation's context spreads over every thread, and a merge pass folds the spans'
// states in order. When that still leaves fewer than 2 items a thread, the group's
// query heads are split over items too (same bits: each head's arithmetic is its own).
//
// Inside an item, per chunk of kChunk keys:
//   scores: 16 keys per vector (a lane per key), each the sequential dot product over
//     head_dim (a fused multiply-add per term); the K plane is tiled (KvCache a_tiled), so the 16 keys of one column
//     are one load (f32) or one widening load (bf16), and every query head of the KV
//     head (GQA: Qwen3-30B-A3B has 8) is scored against that load: the K bytes are read
//     once per item, not once per head;
//   softmax: max, exp (attn_math::exp_neg, vectorised), 16-lane sums;
//   V: o[d] = sum over keys in order of p_j v_j[d], 16 dims per vector, every head of
//     the group against one load of each V row;
//   the chunk's (max, sum, o) folded into its span's state, the span's into the result.
// Causal: chunks and tiles after a token's position are skipped, keys after it inside
// its last tile are masked.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/attention_kernels.h"
#include "model/attention_math.h"

// Internal linkage: each including file (one per ISA) gets its own copy, so the linker
// never mixes an AVX-512 instance into the portable build.
namespace moe::attn_impl {
namespace {

// v16 values cross no call boundary between translation units (internal linkage), so
// the psabi note about passing them without AVX-512 does not apply; GCC reports it at
// the end of the file, past any push/pop, hence no pop.
#pragma GCC diagnostic ignored "-Wpsabi"

using attn_math::exp_neg;
using attn_math::fold;
using attn_math::kChunk;
using attn_math::kLanes;
using attn_math::kSpan;
using attn_math::State;
using attn_math::v16;
using attn_math::vi16;
using attn_math::as_float;
using attn_math::sel;
typedef uint16_t vu16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));

constexpr int kQBlock = 8;  // new tokens of a sequence per prefill item
// Heads scored (and V-summed) per pass: one accumulator vector each plus the key
// vector must stay in registers. AVX-512: 8 zmm of 32; AVX2: a v16 is 2 ymm, 4 heads
// take 8 of 16; SSE: 4 xmm per v16, 2 heads. The grouping never changes the bits (each
// head's arithmetic is its own).
// kHeads2: heads per pass when a pass takes two vectors of keys (scores) or of dims (V
// sums): every q (or p) value loaded then feeds two multiply-adds instead of one, which
// is what bounds these loops (one broadcast load per multiply-add). AVX-512: 2 x 8
// accumulators and 2 loaded vectors of 32 zmm; AVX2: 2 x 2 heads x 2 ymm + 4 of 16 ymm;
// SSE: off (0). Each element's multiply-adds are the same ones in the same order: the
// same bits.
#if defined(__AVX512F__)
constexpr int kHeads = 8, kHeads2 = 8;
#elif defined(__AVX2__)
constexpr int kHeads = 4, kHeads2 = 2;
#else
constexpr int kHeads = 2, kHeads2 = 0;
#endif

#if defined(MOE_ATTN_V16_PAIR)
using attn_math::v8;
using attn_math::vi8;
inline v16 load(const float* p) {
  return {reinterpret_cast<v8>(_mm256_loadu_ps(p)), reinterpret_cast<v8>(_mm256_loadu_ps(p + 8))};
}
inline void store(float* p, v16 v) {
  _mm256_storeu_ps(p, reinterpret_cast<__m256>(v.lo));
  _mm256_storeu_ps(p + 8, reinterpret_cast<__m256>(v.hi));
}
inline vi16 load_i(const void* p) {
  const __m256i* h = static_cast<const __m256i*>(p);
  return {reinterpret_cast<vi8>(_mm256_loadu_si256(h)), reinterpret_cast<vi8>(_mm256_loadu_si256(h + 1))};
}
#else
inline v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline vi16 load_i(const void* p) {
  vi16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
#endif
inline v16 load_kv(const float* p) { return load(p); }
inline v16 load_kv(const uint16_t* p) {  // 16 bf16 widened exactly: the bits << 16
#if defined(__AVX512F__)
  // One vpmovzxwd to zmm (the generic form below takes two halves). maskz and the
  // vector-extension shift: the unmasked intrinsics trip GCC 12's -Wmaybe-uninitialized
  // inside its own header.
  const __m512i w16 = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return reinterpret_cast<v16>(reinterpret_cast<vi16>(w16) << 16);
#elif defined(MOE_ATTN_V16_PAIR)
  const __m128i* h = reinterpret_cast<const __m128i*>(p);
  return as_float(vi16{reinterpret_cast<vi8>(_mm256_cvtepu16_epi32(_mm_loadu_si128(h))),
                       reinterpret_cast<vi8>(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + 1)))} << 16);
#else
  vu16 h;
  std::memcpy(&h, p, sizeof h);
  const vi16 w = __builtin_convertvector(h, vi16) << 16;
  return as_float(w);
#endif
}
#if defined(MOE_ATTN_V16_PAIR)
inline const vi16 kIota = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
#else
inline const vi16 kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#endif

struct Item {
  int32_t seq, kvh;
  int32_t t0, nt;          // tokens [t0, t0 + nt) of the step
  int32_t span0, span1;    // spans [span0, span1) of the context
  int64_t part = -1;       // split items: index of its partial states, else -1
  int32_t g0 = 0, gn = 0;  // query heads [g0, g0 + gn) of the KV head's group
};

struct Scratch {
  std::vector<float> tile;  // [head_dim][kLanes]: a gathered K tile (untiled or small blocks)
  std::vector<float> sc;    // [rows][kChunk]: scores, then probabilities
  std::vector<float> oc;    // [G][head_dim]: one chunk's V sums of a token's heads
  std::vector<float> so, ro;  // [rows][head_dim]: span and result states' o
  std::vector<float> cm, cl;  // [G]: a chunk's max and sum per head
  std::vector<State> S, R;    // [rows]
  std::vector<const void*> vrows;  // [kChunk]: the chunk's V rows
};

// The chunk's max score, as the reference's chain m = std::max(m, row[j]) from row[0]
// gives it, in 16 lanes: a lane takes x only when x > its value, so a NaN never enters
// unless row[0] is one (then every lane keeps it, as the chain does). Ties of +0 and -0
// may pick the other zero than the chain; every use of m is exp_neg of a difference with
// it, and exp_neg(+0) = exp_neg(-0) = 1, so the results keep their bits. (The scalar
// chain, a 4-cycle vmaxss per key and head, took 10 % of the kernel's time in a decode
// step at 4096 positions.)
// The lanes are then combined by halves (a NaN lane only where every lane is one).
inline float chunk_max(const float* row, int64_t jn) {
  v16 mv = row[0] - v16{};  // a broadcast: x - (+0) is x for every x, -0 and NaN included
  for (int64_t j0 = 0; j0 < jn; j0 += kLanes) {  // row holds kChunk floats: j0 + 16 stays inside
    const v16 x = load(row + j0);
    mv = sel((kIota < static_cast<int32_t>(jn - j0)) & (x > mv), x, mv);
  }
#if defined(MOE_ATTN_V16_PAIR)
  auto fold_max = [](v8 a, v8 b) { return b > a ? b : a; };
  v8 m8 = fold_max(mv.lo, mv.hi);  // lane i against lane i + 8, as below
  m8 = fold_max(m8, __builtin_shufflevector(m8, m8, 4, 5, 6, 7, 4, 5, 6, 7));
  m8 = fold_max(m8, __builtin_shufflevector(m8, m8, 2, 3, 2, 3, 2, 3, 2, 3));
  m8 = fold_max(m8, __builtin_shufflevector(m8, m8, 1, 1, 1, 1, 1, 1, 1, 1));
  return m8[0];
#else
  auto fold_max = [](v16 a, v16 b) { return b > a ? b : a; };
  mv = fold_max(mv, __builtin_shufflevector(mv, mv, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  mv = fold_max(mv, __builtin_shufflevector(mv, mv, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7));
  mv = fold_max(mv, __builtin_shufflevector(mv, mv, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
  mv = fold_max(mv, __builtin_shufflevector(mv, mv, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
  return mv[0];
#endif
}

// attn_math::lane_sum in registers: lane i + lane i + 8, then + 4, + 2, + 1, the same
// additions of the same pairs.
inline float lane_sum(v16 h) {
#if defined(MOE_ATTN_V16_PAIR)
  v8 l = h.lo + h.hi;
  l = l + __builtin_shufflevector(l, l, 4, 5, 6, 7, 4, 5, 6, 7);
  l = l + __builtin_shufflevector(l, l, 2, 3, 2, 3, 2, 3, 2, 3);
  l = l + __builtin_shufflevector(l, l, 1, 1, 1, 1, 1, 1, 1, 1);
  return l[0];
#else
  h = h + __builtin_shufflevector(h, h, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  h = h + __builtin_shufflevector(h, h, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
  h = h + __builtin_shufflevector(h, h, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  h = h + __builtin_shufflevector(h, h, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  return h[0];
#endif
}

// A K tile's column of 16 keys as the score loops read it: load_kv, except a bf16 cache
// on AVX2, read as its 8 even keys, then its 8 odd ones (one 32-byte load, a shift and
// a mask, where widening in key order takes two vpmovzxwd on the shuffle port for every
// 2 multiply-adds of a head). key_order<E> puts a finished score vector back in key
// order. Each key's dot product is the same chain either way: the same bits.
inline v16 load_k(const float* p) { return load_kv(p); }
#if defined(MOE_ATTN_V16_PAIR)
inline v16 load_k(const uint16_t* p) {
  const vi8 w = reinterpret_cast<vi8>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return as_float(vi16{w << 16, w & static_cast<int32_t>(0xFFFF0000u)});
}
template <class E>
inline v16 key_order(v16 s) {
  if constexpr (std::is_same_v<E, uint16_t>) {
    // lo: keys 0 2 .. 14, hi: 1 3 .. 15; the unpacks give keys 0-3 8-11 and 4-7 12-15.
    const __m256 a = _mm256_unpacklo_ps(reinterpret_cast<__m256>(s.lo), reinterpret_cast<__m256>(s.hi));
    const __m256 b = _mm256_unpackhi_ps(reinterpret_cast<__m256>(s.lo), reinterpret_cast<__m256>(s.hi));
    return {reinterpret_cast<v8>(_mm256_permute2f128_ps(a, b, 0x20)),
            reinterpret_cast<v8>(_mm256_permute2f128_ps(a, b, 0x31))};
  }
  return s;
}
#else
inline v16 load_k(const uint16_t* p) { return load_kv(p); }
template <class E>
inline v16 key_order(v16 s) {
  return s;
}
#endif

// Scores of NG heads (q rows hd apart) against 16 keys: column d of the keys at
// kt + d * kstride. out[g * ldo + lane] = scale * sum_d q_g[d] k_lane[d], d in order,
// one fused multiply-add per term.
template <int NG, class E>
inline void score_heads(const float* q, int64_t hd, const E* kt, int64_t kstride, float* out, int64_t ldo,
                        float scale) {
  v16 acc[NG];
  for (int g = 0; g < NG; ++g) acc[g] = v16{};
  for (int64_t d = 0; d < hd; ++d) {
    const v16 k = load_k(kt + d * kstride);
    for (int g = 0; g < NG; ++g) acc[g] = attn_math::fmadd(q[g * hd + d], k, acc[g]);
  }
  for (int g = 0; g < NG; ++g) store(out + g * ldo, key_order<E>(acc[g]) * scale);
}

// score_heads against two tiles of 16 keys at once (kt0, kt1: the same stride):
// out[g * ldo + lane] for kt0's keys, out[g * ldo + 16 + lane] for kt1's.
template <int NG, class E>
inline void score_heads2(const float* q, int64_t hd, const E* kt0, const E* kt1, int64_t kstride, float* out,
                         int64_t ldo, float scale) {
  v16 a0[NG], a1[NG];
  for (int g = 0; g < NG; ++g) a0[g] = a1[g] = v16{};
  for (int64_t d = 0; d < hd; ++d) {
    const v16 k0 = load_k(kt0 + d * kstride), k1 = load_k(kt1 + d * kstride);
    for (int g = 0; g < NG; ++g) {
      const float qd = q[g * hd + d];
      a0[g] = attn_math::fmadd(qd, k0, a0[g]);
      a1[g] = attn_math::fmadd(qd, k1, a1[g]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    store(out + g * ldo, key_order<E>(a0[g]) * scale);
    store(out + g * ldo + kLanes, key_order<E>(a1[g]) * scale);
  }
}

// oc[g][d] = sum over j < jn, in order, of p[g * kChunk + j] * v_j[d], NG heads, dims
// [d0, d0 + 16).
template <int NG, class E>
inline void v_heads(const float* p, int64_t jn, const void* const* vrows, int64_t off, float* oc, int64_t hd) {
  v16 acc[NG];
  for (int g = 0; g < NG; ++g) acc[g] = v16{};
  for (int64_t j = 0; j < jn; ++j) {
    const v16 v = load_kv(static_cast<const E*>(vrows[j]) + off);
    for (int g = 0; g < NG; ++g) acc[g] = attn_math::fmadd(p[g * kChunk + j], v, acc[g]);
  }
  for (int g = 0; g < NG; ++g) store(oc + g * hd, acc[g]);
}

// 32 stored values as two vectors. f32: [0, 16) and [16, 32). bf16: the even-indexed
// values and the odd ones, each widened exactly from one 64-byte load by a shift or a
// mask (2 vector operations where two widening loads took 4, next to 16 multiply-adds),
// so a bf16 cache's V sums hold their 32 dims permuted (see stored_dim).
inline void load_kv32(const float* p, v16& v0, v16& v1) {
  v0 = load(p);
  v1 = load(p + kLanes);
}
inline void load_kv32(const uint16_t* p, v16& v0, v16& v1) {
  const vi16 w = load_i(p);
  v0 = as_float(w << 16);
  v1 = as_float(w & static_cast<int32_t>(0xFFFF0000u));
}
// Where dim d of a V sum (and of the states folded from it) is kept: v_heads2 over a
// bf16 cache keeps each group of 32 dims as its 16 even dims, then its 16 odd ones; every
// other dim (and every dim of an f32 cache, or of a build without v_heads2) in place.
// The fold is element-wise, so only the final division reads through this map.
template <class E>
inline int64_t stored_dim(int64_t d, int64_t hd) {
  if constexpr (kHeads2 > 0 && std::is_same_v<E, uint16_t>) {
    if (d < hd / (2 * kLanes) * (2 * kLanes)) {
      const int64_t r = d % (2 * kLanes);
      return d - r + (r & 1) * kLanes + r / 2;
    }
  }
  return d;
}

// v_heads over two vectors of dims at once: the 32 dims [off, off + 32) into oc[0, 32)
// as load_kv32 orders them.
template <int NG, class E>
inline void v_heads2(const float* p, int64_t jn, const void* const* vrows, int64_t off, float* oc, int64_t hd) {
  v16 a0[NG], a1[NG];
  for (int g = 0; g < NG; ++g) a0[g] = a1[g] = v16{};
  for (int64_t j = 0; j < jn; ++j) {
    v16 v0, v1;
    load_kv32(static_cast<const E*>(vrows[j]) + off, v0, v1);
    for (int g = 0; g < NG; ++g) {
      const float pj = p[g * kChunk + j];
      a0[g] = attn_math::fmadd(pj, v0, a0[g]);
      a1[g] = attn_math::fmadd(pj, v1, a1[g]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    store(oc + g * hd, a0[g]);
    store(oc + g * hd + kLanes, a1[g]);
  }
}

// Runs f<NG>(g0) over the G heads in passes of W (the last pass narrower).
template <int W, template <int> class F, class... Args>
inline void by_head_groups_of(int64_t G, Args&&... args) {
  int64_t g0 = 0;
  for (; g0 + W <= G; g0 += W) F<W>::run(g0, args...);
  switch (G - g0) {
    case 0: break;
#define MOE_ATTN_CASE(n) \
  case n:                \
    if constexpr (n < W) F<n>::run(g0, args...); \
    break;
    MOE_ATTN_CASE(1) MOE_ATTN_CASE(2) MOE_ATTN_CASE(3) MOE_ATTN_CASE(4) MOE_ATTN_CASE(5) MOE_ATTN_CASE(6)
    MOE_ATTN_CASE(7)
#undef MOE_ATTN_CASE
  }
}
template <template <int> class F, class... Args>
inline void by_head_groups(int64_t G, Args&&... args) {
  by_head_groups_of<kHeads, F>(G, args...);
}

template <class E>
struct ScorePass {
  template <int NG>
  struct F {
    static void run(int64_t g0, const float* qt, int64_t hd, const E* kt, int64_t kstride, float* out, float scale) {
      score_heads<NG, E>(qt + g0 * hd, hd, kt, kstride, out + g0 * kChunk, kChunk, scale);
    }
  };
};

template <class E>
struct ScorePass2 {
  template <int NG>
  struct F {
    static void run(int64_t g0, const float* qt, int64_t hd, const E* kt0, const E* kt1, int64_t kstride, float* out,
                    float scale) {
      score_heads2<NG, E>(qt + g0 * hd, hd, kt0, kt1, kstride, out + g0 * kChunk, kChunk, scale);
    }
  };
};

template <class E>
struct VPass2 {
  template <int NG>
  struct F {
    static void run(int64_t g0, const float* p, int64_t jn, const void* const* vrows, int64_t off, float* oc,
                    int64_t hd) {
      v_heads2<NG, E>(p + g0 * kChunk, jn, vrows, off, oc + g0 * hd, hd);
    }
  };
};

template <class E>
struct VPass {
  template <int NG>
  struct F {
    static void run(int64_t g0, const float* p, int64_t jn, const void* const* vrows, int64_t off, float* oc,
                    int64_t hd) {
      v_heads<NG, E>(p + g0 * kChunk, jn, vrows, off, oc + g0 * hd, hd);
    }
  };
};

// E: the cache's element type, float (f32) or uint16_t (bf16 bits). part: where a split
// item leaves its states ([rows][2 + head_dim]: m, l, o; l = 0 for a token with no key
// in the span), or nullptr to write the finished output into a.ctx.
template <class E>
inline void attend_item(const GqaAttendArgs& a, const Item& it, Scratch& s, float* part) {
  const StepBatch& b = *a.batch;
  const SeqSpan& sp = b.seqs[it.seq];
  const KvCache& cache = *a.cache;
  const int64_t hd = a.head_dim, G = a.n_heads / a.n_kv, ldq = a.n_heads * hd, kvh = it.kvh;
  const int64_t GN = it.gn, qh = kvh * G + it.g0;  // the item's heads, and its first query head
  const int64_t B = cache.block_size(), rows = it.nt * GN;
  const bool tiled = cache.shape().a_tiled, fast = tiled && B % kLanes == 0;
  int64_t pos[kQBlock], maxpos = 0;
  for (int64_t t = 0; t < it.nt; ++t) maxpos = std::max<int64_t>(maxpos, pos[t] = b.positions[it.t0 + t]);

  s.tile.resize(hd * kLanes);
  s.sc.resize(rows * kChunk);
  s.oc.resize(G * hd);
  s.so.resize(rows * hd);
  s.ro.resize(rows * hd);
  s.cm.resize(G);
  s.cl.resize(G);
  s.S.assign(rows, State{});
  s.R.assign(rows, State{});
  s.vrows.resize(kChunk);
  for (int64_t r = 0; r < rows; ++r) {
    s.S[r].o = s.so.data() + r * hd;
    s.R[r].o = s.ro.data() + r * hd;
  }
  float* sc = s.sc.data();
  const int64_t d16 = hd / kLanes * kLanes;

  for (int64_t span = it.span0; span < it.span1; ++span) {
    const int64_t sp0 = span * kSpan, sp1 = std::min(sp0 + kSpan, maxpos + 1);
    if (sp0 >= sp1) break;
    for (int64_t r = 0; r < rows; ++r) s.S[r].empty = true;
    for (int64_t c0 = sp0; c0 < sp1; c0 += kChunk) {
      const int64_t c1 = std::min(c0 + kChunk, sp1);  // keys some token of the item needs
      // Scores of every token's heads, 16 keys at a time.
      for (int64_t j0 = c0; j0 < c1; j0 += kLanes) {
        // Every token that sees some of these 16 keys scores all its heads against them.
        auto score = [&](auto* kt, int64_t kstride) {
          using K = std::remove_const_t<std::remove_pointer_t<decltype(kt)>>;
          for (int64_t t = 0; t < it.nt; ++t) {
            if (pos[t] < j0) continue;  // the whole tile is after this token
            by_head_groups<ScorePass<K>::template F>(GN, a.q + (it.t0 + t) * ldq + qh * hd, hd, kt, kstride,
                                                     sc + t * GN * kChunk + (j0 - c0), a.scale);
          }
        };
        if (fast) {  // 16 positions of one block: column d at + d * B
          if (kHeads2 > 0 && j0 + kLanes < c1) {  // and the next 16 (some token needs them): both in one pass
            const E* kt0 = cache.a_block<E>(a.layer, sp.slot, j0) + kvh * hd * B;
            const E* kt1 = cache.a_block<E>(a.layer, sp.slot, j0 + kLanes) + kvh * hd * B;
            if constexpr (kHeads2 > 0)
              for (int64_t t = 0; t < it.nt; ++t) {
                // A token before the second tile scores it too: those entries lie past
                // its last key in the chunk, which the softmax never reads.
                if (pos[t] < j0) continue;
                by_head_groups_of<kHeads2, ScorePass2<E>::template F>(
                    GN, a.q + (it.t0 + t) * ldq + qh * hd, hd, kt0, kt1, B, sc + t * GN * kChunk + (j0 - c0),
                    a.scale);
              }
            j0 += kLanes;
            continue;
          }
          score(cache.a_block<E>(a.layer, sp.slot, j0) + kvh * hd * B, B);
          continue;
        }
        // Small blocks or an untiled plane: gather the same values into an f32 tile.
        float* tile = s.tile.data();
        for (int64_t l = 0; l < kLanes; ++l) {
          if (j0 + l >= c1) {
            for (int64_t d = 0; d < hd; ++d) tile[d * kLanes + l] = 0.f;
          } else if (tiled) {
            const E* k = cache.a_block<E>(a.layer, sp.slot, j0 + l) + kvh * hd * B;
            for (int64_t d = 0; d < hd; ++d) tile[d * kLanes + l] = kv_widen(k[d * B]);
          } else {
            const E* k = cache.a_row<E>(a.layer, sp.slot, j0 + l) + kvh * hd;
            for (int64_t d = 0; d < hd; ++d) tile[d * kLanes + l] = kv_widen(k[d]);
          }
        }
        score(static_cast<const float*>(tile), int64_t{kLanes});
      }
      // Softmax of the chunk, V sums and the fold, token by token.
      for (int64_t t = 0; t < it.nt; ++t) {
        if (pos[t] < c0) continue;
        const int64_t jn = std::min(c1, pos[t] + 1) - c0;  // keys of this token in the chunk
        for (int64_t g = 0; g < GN; ++g) {
          float* row = sc + (t * GN + g) * kChunk;
          const float m = chunk_max(row, jn);
          v16 lsum = v16{};
          for (int64_t j0 = 0; j0 < jn; j0 += kLanes) {
            v16 p = exp_neg(load(row + j0) - m);
            p = sel(kIota < static_cast<int32_t>(jn - j0), p, v16{});
            store(row + j0, p);
            lsum = lsum + p;
          }
          s.cm[g] = m;
          s.cl[g] = lane_sum(lsum);
        }
        // One table lookup per block, not per key (it divides by the block size).
        for (int64_t j = 0; j < jn;) {
          const E* v = cache.b_head<E>(a.layer, sp.slot, c0 + j, kvh, hd);
          const int64_t run = std::min(jn - j, B - (c0 + j) % B), vs = cache.b_pos_stride();
          for (int64_t i = 0; i < run; ++i) s.vrows[j + i] = v + i * vs;
          j += run;
        }
        const float* p = sc + t * GN * kChunk;
        int64_t d0 = 0;
        if constexpr (kHeads2 > 0)
          for (; d0 + 2 * kLanes <= d16; d0 += 2 * kLanes)
            by_head_groups_of<kHeads2, VPass2<E>::template F>(GN, p, jn, s.vrows.data(), d0, s.oc.data() + d0, hd);
        for (; d0 < d16; d0 += kLanes)
          by_head_groups<VPass<E>::template F>(GN, p, jn, s.vrows.data(), d0, s.oc.data() + d0, hd);
        for (int64_t d = d16; d < hd; ++d)  // head_dim tail: the same sums, a scalar per dim
          for (int64_t g = 0; g < GN; ++g) {
            float acc = 0.f;
            for (int64_t j = 0; j < jn; ++j)
              acc = attn_math::fmadd(p[g * kChunk + j], kv_widen(static_cast<const E*>(s.vrows[j])[d]), acc);
            s.oc[g * hd + d] = acc;
          }
        for (int64_t g = 0; g < GN; ++g) fold(s.S[t * GN + g], s.cm[g], s.cl[g], s.oc.data() + g * hd, hd);
      }
    }
    for (int64_t r = 0; r < rows; ++r)
      if (!s.S[r].empty) fold(s.R[r], s.S[r].m, s.S[r].l, s.S[r].o, hd);
  }

  for (int64_t r = 0; r < rows; ++r) {
    const State& R = s.R[r];
    if (part) {
      float* pr = part + r * (2 + hd);
      pr[0] = R.m;
      pr[1] = R.empty ? 0.f : R.l;
      if (!R.empty) std::copy(R.o, R.o + hd, pr + 2);
    } else {
      const int64_t t = r / GN, g = r % GN;
      float* o = a.ctx + (it.t0 + t) * ldq + (qh + g) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = R.o[stored_dim<E>(d, hd)] / R.l;
    }
  }
}

inline void gqa_attend(const GqaAttendArgs& a) {
  const StepBatch& b = *a.batch;
  const int64_t hd = a.head_dim, G = a.n_heads / a.n_kv, ldq = a.n_heads * hd;
  // Reused: no allocation per layer and step. Inside the parallel regions these names
  // would be each thread's own copies, so the regions use the pointers taken below.
  thread_local std::vector<Item> items;   // the work
  thread_local std::vector<Item> merges;  // split sequences: one per (token block, KV head), part = its first span's
  thread_local std::vector<float> parts;  // split items' states: [item][rows][2 + head_dim]
  items.clear();
  merges.clear();
  auto n_spans_of = [](const SeqSpan& sp) { return static_cast<int32_t>((sp.start_pos + sp.n + kSpan - 1) / kSpan); };
  auto splits = [&](const SeqSpan& sp) {  // one item per span (decode), merged after
    return a.schedule == GqaSchedule::split_spans ||
           (a.schedule == GqaSchedule::automatic && sp.n <= kQBlock && n_spans_of(sp) > 1);
  };
  // Split sequences' KV heads go to 2, 4 ... items of fewer query heads each while the
  // step has under 2 items a thread: at 512 positions a decode step is 4 KV heads x 2
  // spans = 8 items, so 16 threads ran attention on 8. Each head's arithmetic is its own,
  // so the bits do not change; the K and V rows are read once per item instead of once
  // per group. (Measured on 16 threads at 512 positions: 0.21 -> 0.20 ms a step, the two
  // parallel regions a layer left as they were.)
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t planned = 0;
  for (const SeqSpan& sp : b.seqs)
    if (sp.n > 0) planned += (sp.n + kQBlock - 1) / kQBlock * a.n_kv * (splits(sp) ? n_spans_of(sp) : 1);
  int32_t head_parts = 1;
  while (head_parts * 2 <= G && G % (head_parts * 2) == 0 && planned * head_parts < 2 * team) head_parts *= 2;
  const int32_t gn = static_cast<int32_t>(G) / head_parts;
  int64_t work = 0, n_parts = 0;  // work: multiply-adds, roughly
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const SeqSpan& sp = b.seqs[si];
    if (sp.n == 0) continue;
    const int32_t n_spans = n_spans_of(sp);
    const bool split = splits(sp);
    for (int64_t t0 = 0; t0 < sp.n; t0 += kQBlock)
      for (int32_t h = 0; h < a.n_kv; ++h) {
        const Item whole{static_cast<int32_t>(si), h, static_cast<int32_t>(sp.first + t0),
                         static_cast<int32_t>(std::min<int64_t>(kQBlock, sp.n - t0)), 0, n_spans, -1, 0,
                         static_cast<int32_t>(G)};
        if (!split) {
          items.push_back(whole);
          continue;
        }
        // One item per span (and head part), its states merged in span order afterwards.
        for (int32_t g0 = 0; g0 < G; g0 += gn) {
          Item m = whole;
          m.part = n_parts;
          m.g0 = g0;
          m.gn = gn;
          merges.push_back(m);
          for (int32_t span = 0; span < n_spans; ++span) {
            Item one = m;
            one.span0 = span;
            one.span1 = span + 1;
            one.part = n_parts++;
            items.push_back(one);
          }
        }
      }
    work += sp.n * (sp.start_pos + sp.n) * a.n_heads * hd;
  }
  const int64_t part_len = kQBlock * G * (2 + hd);
  if (static_cast<int64_t>(parts.size()) < n_parts * part_len) parts.resize(n_parts * part_len);
  const int64_t n = static_cast<int64_t>(items.size()), nm = static_cast<int64_t>(merges.size());
  const Item* list = items.data();
  const Item* mlist = merges.data();
  float* part_base = parts.data();
  const bool bf16 = a.cache->dtype() == DType::BF16;
  // Small steps run on one thread: waking a team costs more than the work.
  const bool par = n > 1 && work >= (int64_t{1} << 17);
  // The merge goes row by row (a token's query head: its spans' states folded in order),
  // not item by item: a decode step has one merge per KV head, 4 for Qwen3-30B-A3B, and
  // at 32k positions each folds 128 spans for 8 heads, so 4 of 16 threads worked. It runs
  // in the items' region, after their barrier: one wake-up of the team a layer, not two.
  thread_local std::vector<std::pair<int32_t, int32_t>> merge_rows;  // (merge, row)
  merge_rows.clear();
  for (int64_t i = 0; i < nm; ++i)
    for (int32_t r = 0; r < mlist[i].nt * mlist[i].gn; ++r) merge_rows.emplace_back(static_cast<int32_t>(i), r);
  const int64_t n_rows = static_cast<int64_t>(merge_rows.size());
  const std::pair<int32_t, int32_t>* rows = merge_rows.data();
#pragma omp parallel if (par)
  {
    static thread_local Scratch s;
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < n; ++i) {
      float* part = list[i].part >= 0 ? part_base + list[i].part * part_len : nullptr;
      if (bf16) attend_item<uint16_t>(a, list[i], s, part);
      else attend_item<float>(a, list[i], s, part);
    }
    // (the loop's barrier: every span state is written before any row folds them)
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < n_rows; ++i) {
      const Item& m = mlist[rows[i].first];
      const int64_t r = rows[i].second;
      static thread_local std::vector<float> o;
      o.resize(hd);
      State R;
      R.o = o.data();
      for (int64_t span = 0; span < m.span1; ++span) {
        const float* pr = part_base + (m.part + span) * part_len + r * (2 + hd);
        if (pr[1] != 0.f) fold(R, pr[0], pr[1], pr + 2, hd);
      }
      const int64_t t = r / m.gn, g = r % m.gn;
      float* out = a.ctx + (m.t0 + t) * ldq + (m.kvh * G + m.g0 + g) * hd;
      if (bf16)
        for (int64_t d = 0; d < hd; ++d) out[d] = R.o[stored_dim<uint16_t>(d, hd)] / R.l;
      else
        for (int64_t d = 0; d < hd; ++d) out[d] = R.o[d] / R.l;
    }
  }
}

}  // namespace
}  // namespace moe::attn_impl
