// The arithmetic that defines moe-ep's attention result (model/attention_kernels.h), in
// one place for the kernels (each ISA build) and the plain reference loop: the chunk
// and span sizes, exp, the 16-lane sum and the fold of partial softmax states.
//
// Attention of one query row over positions 0..n-1 is computed in fixed pieces of the
// *positions*, never of the work: chunks of kChunk keys (a softmax each: max, exp,
// sum, weighted V sum), folded in order into a span's state, spans of kSpan keys
// folded in order into the result. Because the pieces depend only on positions, the
// result is the same bits whatever the batch, the thread count, how the work is split
// (one item per span for decode, one item for all spans in prefill) or the ISA: a
// KV-cached decode step still equals recomputing the prefix, and a prompt served from
// cached blocks equals a cold one.
//
// Everything here is element-wise IEEE arithmetic, written once for a float and once
// for a 16-lane vector with the same operations in the same order, so a vector lane and
// the scalar give equal bits. The dot products and V sums are fused multiply-adds
// (fmadd: one rounding per term, as std::fma), explicit because the build has
// -ffp-contract=off: a zmm/ymm FMA where the ISA has one, std::fma per lane in the
// portable build (the same bits, slower), never a silent contraction.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace moe::attn_math {
namespace {  // internal linkage: every ISA's translation unit keeps its own copy

// v16 values cross no call boundary between translation units (internal linkage), so
// the psabi note about passing them without AVX-512 does not apply; GCC reports it at
// the end of the file, past any push/pop, hence no pop.
#pragma GCC diagnostic ignored "-Wpsabi"

// 64 keys per softmax chunk: the chunk's K tiles (64 x head_dim 128 x 2 bytes = 16 KiB
// in bf16) and V rows stay in L1 (32-48 KiB) between the score and the V pass.
constexpr int64_t kChunk = 64;
// 256 keys per span: decode splits a sequence's context over threads by span, so a
// 4096-token context gives 16 items per KV head; a span's fold costs one pass over
// head_dim per chunk, nothing next to 256 keys x head_dim of multiply-adds.
constexpr int64_t kSpan = 256;
constexpr int kLanes = 16;

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// AVX2: 16 lanes as two ymm halves, a struct of two native 8-lane vectors. A 64-byte
// GCC vector has no machine mode without AVX-512, so GCC kept every v16 in memory and
// did each operation piece by piece through the stack: the kernel read a bf16 KV cache
// at 1.2 GB/s at decode on a 2-vCPU Zen 3 (bench_attention, 2 threads; the struct: see
// docs/PERF.md). Every operation below is the same element-wise one, lane i of lo
// being lane i of the vector and lane i of hi lane 8 + i, so the bits are the same.
#define MOE_ATTN_V16_PAIR 1
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t vi8 __attribute__((vector_size(8 * sizeof(int32_t))));
struct vi16 {
  vi8 lo, hi;
};
struct v16 {
  v8 lo, hi;
};
inline v16 operator+(v16 a, v16 b) { return {a.lo + b.lo, a.hi + b.hi}; }
inline v16 operator-(v16 a, v16 b) { return {a.lo - b.lo, a.hi - b.hi}; }
inline v16 operator*(v16 a, v16 b) { return {a.lo * b.lo, a.hi * b.hi}; }
inline v16 operator/(v16 a, v16 b) { return {a.lo / b.lo, a.hi / b.hi}; }
inline v16 operator+(v16 a, float b) { return {a.lo + b, a.hi + b}; }
inline v16 operator-(v16 a, float b) { return {a.lo - b, a.hi - b}; }
inline v16 operator*(v16 a, float b) { return {a.lo * b, a.hi * b}; }
inline v16 operator-(float a, v16 b) { return {a - b.lo, a - b.hi}; }
inline vi16 operator<(v16 a, float b) { return {a.lo < b, a.hi < b}; }
inline vi16 operator>(v16 a, v16 b) { return {a.lo > b.lo, a.hi > b.hi}; }
inline vi16 operator!=(v16 a, v16 b) { return {a.lo != b.lo, a.hi != b.hi}; }
inline vi16 operator<(vi16 a, int32_t b) { return {a.lo < b, a.hi < b}; }
inline vi16 operator&(vi16 a, vi16 b) { return {a.lo & b.lo, a.hi & b.hi}; }
inline vi16 operator&(vi16 a, int32_t b) { return {a.lo & b, a.hi & b}; }
inline vi16 operator+(vi16 a, int32_t b) { return {a.lo + b, a.hi + b}; }
inline vi16 operator<<(vi16 a, int b) { return {a.lo << b, a.hi << b}; }
// m ? a : b lane by lane (m: a comparison's all-ones or zero lanes).
inline v16 sel(vi16 m, v16 a, v16 b) { return {m.lo ? a.lo : b.lo, m.hi ? a.hi : b.hi}; }
// Truncation toward zero, as __builtin_convertvector.
inline vi16 to_int(v16 x) { return {__builtin_convertvector(x.lo, vi8), __builtin_convertvector(x.hi, vi8)}; }
inline v16 as_float(vi16 x) { return {reinterpret_cast<v8>(x.lo), reinterpret_cast<v8>(x.hi)}; }
#else
typedef float v16 __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t vi16 __attribute__((vector_size(kLanes * sizeof(int32_t))));
inline v16 sel(vi16 m, v16 a, v16 b) { return m ? a : b; }
inline vi16 to_int(v16 x) { return __builtin_convertvector(x, vi16); }
inline v16 as_float(vi16 x) { return reinterpret_cast<v16>(x); }
#endif

// c + a * b with one rounding (IEEE fusedMultiplyAdd).
inline float fmadd(float a, float b, float c) { return std::fma(a, b, c); }
inline v16 fmadd(float a, v16 b, v16 c) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16>(
      _mm512_fmadd_ps(_mm512_set1_ps(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#elif defined(MOE_ATTN_V16_PAIR)
  const __m256 av = _mm256_set1_ps(a);  // a broadcast, not `v16{} + a` (an add: -0 + 0 is +0)
  return {reinterpret_cast<v8>(_mm256_fmadd_ps(av, reinterpret_cast<__m256>(b.lo), reinterpret_cast<__m256>(c.lo))),
          reinterpret_cast<v8>(_mm256_fmadd_ps(av, reinterpret_cast<__m256>(b.hi), reinterpret_cast<__m256>(c.hi)))};
#else
  v16 r;
  for (int i = 0; i < kLanes; ++i) r[i] = std::fma(a, b[i], c[i]);
  return r;
#endif
}

// exp(x) for x <= 0 (a score minus the max of its chunk, or of two maxima):
// 2^n * e^r with n = round(x / ln 2) (ties to even, by the 1.5 * 2^23 trick) and
// r = x - n ln 2 in two parts (Cody-Waite; |r| <= ln2 / 2), e^r by a degree-7
// polynomial in Horner form (Cephes' expf coefficients: relative error < 2 ulp on that
// interval). Below -87, 2^n would leave the normal range: 0 (e^-87 ~ 1.6e-38 next to
// the chunk's largest term 1, which is below f32's resolution anyway).
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kRound = 12582912.f;  // 1.5 * 2^23
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
constexpr float kExpMin = -87.f;

inline float exp_neg(float x) {
  if (x != x) return x;  // NaN in, NaN out
  if (x < kExpMin) return 0.f;
  const float n = (x * kLog2e + kRound) - kRound;
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * (r * r) + r;
  p = p + 1.f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// The same operations lane by lane; lanes below kExpMin (and NaN lanes) are computed on
// a clamped value, so 2^n never leaves the normal range, then replaced as the scalar
// returns them.
inline v16 exp_neg(v16 x) {
  const v16 xc = sel(x < kExpMin, v16{} + kExpMin, x);
  const v16 n = (xc * kLog2e + kRound) - kRound;
  v16 r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  v16 p = v16{} + kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * (r * r) + r;
  p = p + 1.f;
  v16 y = p * as_float((to_int(n) + 127) << 23);
  y = sel(x < kExpMin, v16{}, y);
  return sel(x != x, x, y);
}

// The sum of 16 lanes by halves: (l + l+8), then (l + l+4), (l + l+2), (l + l+1).
inline float lane_sum(const float* l16) {
  float h[kLanes];
  std::memcpy(h, l16, sizeof h);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) h[i] = h[i] + h[i + w];
  return h[0];
}

// A partial softmax state over some keys: m their max score, l = sum of exp(s - m),
// o[d] = sum of exp(s - m) v[d]. empty: no key yet.
struct State {
  float m = 0.f, l = 0.f;
  float* o = nullptr;  // [head_dim], owned by the caller
  bool empty = true;
};

// R <- R (+) (m, l, o): the states rescaled to their common max and added. The first
// state is taken as it is, so a single chunk or span passes through unchanged.
inline void fold(State& R, float m, float l, const float* o, int64_t hd) {
  if (R.empty) {
    R.m = m;
    R.l = l;
    std::copy(o, o + hd, R.o);
    R.empty = false;
    return;
  }
  const float mn = std::max(R.m, m);
  const float a = exp_neg(R.m - mn), b = exp_neg(m - mn);
  R.l = R.l * a + l * b;
  for (int64_t d = 0; d < hd; ++d) R.o[d] = R.o[d] * a + o[d] * b;
  R.m = mn;
}

}  // namespace
}  // namespace moe::attn_math
