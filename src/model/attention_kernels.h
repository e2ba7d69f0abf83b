// The attention core of GqaAttention (model/attention.h): causal grouped-query
// attention of a step's queries over the KV cache, the part that grows with the
// context (scores, softmax, weighted sum of V).
//
// Flash attention over the paged cache (model/attention_kernels_impl.h): keys in
// chunks of 64 with an online softmax, chunks folded into spans of 256 positions, spans
// folded into the result, in position order; the query heads of a KV head share every
// K and V load; a decode step's context is split over threads by span and merged.
// The pieces are fixed by position (model/attention_math.h), so the result is the same
// bits whatever the batch, the chunking of a prompt, the thread count or the ISA: a
// KV-cached decode step equals recomputing the prefix, and gqa_attend equals the plain
// loop gqa_attend_reference bit for bit. A bf16 cache is widened (exactly) as it is
// read, so the same holds for it on the bf16-rounded K and V. AVX-512, AVX2 and
// portable builds of the same code are chosen at run time.
#pragma once

#include <cstdint>

#include "model/batch.h"
#include "model/kv_cache.h"

namespace moe {

// How the work is cut (never the result): automatic splits a sequence with at most 8
// new tokens and a context over 256 positions into one item per span; tests force
// either schedule to check that both give the same bits.
enum class GqaSchedule { automatic, whole_context, split_spans };

struct GqaAttendArgs {
  const StepBatch* batch = nullptr;
  const KvCache* cache = nullptr;  // K in plane A (tiled or not), V in plane B, [slot, pos, n_kv*head_dim], f32 or bf16
  int64_t layer = 0;
  const float* q = nullptr;  // [T, n_heads*head_dim] after q-norm and RoPE
  float* ctx = nullptr;      // out [T, n_heads*head_dim]
  int64_t n_heads = 0, n_kv = 0, head_dim = 0;
  float scale = 1.f;
  GqaSchedule schedule = GqaSchedule::automatic;
};

void gqa_attend(const GqaAttendArgs& a);

// The plain loop (one query and head at a time, the same chunks, spans and exp; no
// vectors), kept as the reference the tests compare against.
void gqa_attend_reference(const GqaAttendArgs& a);
// MLA's attention in the latent space (model/attention.h MlaAttention) of the step's
// tokens [t0, t0 + tc), every head: per head and token, the scores
//   s_j = scale * (q_lat . c_kv_j + q_pe . k_pe_j)   (one fused multiply-add chain,
//         the kv_lora dims in order, then the rope dims)
// over the slot's cached rows j in [0, position] (c_kv in plane A, k_pe in plane B, rows
// not tiled), softmax, and o_lat = sum_j p_j c_kv_j. Defined in fixed pieces of the
// positions, as the GQA attention is (model/attention_math.h): chunks of kChunk keys
// (max chain, p_j = exp_neg(s_j - max), l = the p_j added in order, o = the p_j c_kv_j
// multiply-added in order) folded in order into their span of kSpan keys, spans folded in
// order into the result (attn_math::fold), then o / l. So a token's result has the same
// bits in any batch, under any chunking of its prompt, on any thread count and ISA, split
// by span or not: a KV-cached decode step equals recomputing the prefix. The kernel puts
// 16 heads in the vector lanes (model/attention_mla_impl.h).
struct MlaAttendArgs {
  const StepBatch* batch = nullptr;
  const KvCache* cache = nullptr;
  int64_t layer = 0;
  int64_t t0 = 0, tc = 0;  // the step's tokens attended
  int64_t n_heads = 0;
  const float* q_lat = nullptr;  // [n_heads, tc, kv_lora]: head h of token t0 + i at row h * tc + i
  // Token t's head h's rotary query, [rope dims], at q_pe + t * pe_ld_t + h * pe_ld_h.
  const float* q_pe = nullptr;
  int64_t pe_ld_t = 0, pe_ld_h = 0;
  float scale = 1.f;
  float* o_lat = nullptr;  // out [n_heads, tc, kv_lora], as q_lat
  // How the work is cut (never the result): automatic splits each token's context by span
  // when the call has under 2 items (a token and 16 heads) a thread; tests force either.
  GqaSchedule schedule = GqaSchedule::automatic;
};
void mla_attend(const MlaAttendArgs& a);
// The definition above, one head of one token at a time, scalar: the tests' reference.
void mla_attend_reference(const MlaAttendArgs& a);

}  // namespace moe
