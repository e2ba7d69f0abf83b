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
// MLA's attention of one query head in the latent space (model/attention.h MlaAttention):
// scores (q_lat . c_kv_j + q_pe . k_pe_j) * scale over the slot's cached rows [0, n_ctx)
// (c_kv in plane A, k_pe in plane B), softmax, and o_lat = sum_j p_j c_kv_j. The same
// bits on every ISA and in any batch (fixed orders, attention_kernels_impl.h).
struct MlaAttendArgs {
  const KvCache* cache = nullptr;
  int64_t layer = 0, slot = 0, n_ctx = 0;
  const float* q_lat = nullptr;  // [kv_lora]
  const float* q_pe = nullptr;   // [rope dims]
  float scale = 1.f;
  float* sc = nullptr;     // scratch [n_ctx]: scores, then probabilities
  float* o_lat = nullptr;  // out [kv_lora]
};
void mla_latent_attend(const MlaAttendArgs& a);

// Softmax of sc[0..n) in place: f32, max-subtracted, sequential sum (as torch.softmax),
// for MLA's attention (model/attention.cpp).
void softmax_inplace(float* sc, int64_t n);

}  // namespace moe
