// The attention core of GqaAttention (model/attention.h): causal grouped-query
// attention of a step's queries over the KV cache, the part that grows with the
// context (scores, softmax, weighted sum of V).
//
// Blocked for the cache: a work item is (sequence, key/value head, block of up to 8 of
// the sequence's new tokens); it transposes 16 cached keys at a time into a tile and
// scores all its queries (tokens x the heads sharing that K/V head) against the tile,
// 16 keys per vector, then runs the softmax and the V sum row by row. Each score is
// still the plain sequential dot product over head_dim (a vector lane per key), each
// output element the sequential sum over positions (a vector lane per dimension), and
// the softmax is the same scalar loop, so the result is bitwise that of the plain loop
// (one query and head at a time), whatever the batch, block or ISA: a KV-cached decode
// step still equals recomputing the prefix. AVX-512 and portable builds of the same
// code (attention_kernels_avx512.cpp) are chosen at run time. A bf16 cache is read
// widened (exactly) to f32, so the same holds for it: the result is bitwise the plain
// loop's on the bf16-rounded K and V.
#pragma once

#include <cstdint>

#include "model/batch.h"
#include "model/kv_cache.h"

namespace moe {

struct GqaAttendArgs {
  const StepBatch* batch = nullptr;
  const KvCache* cache = nullptr;  // K in plane A, V in plane B, [slot, pos, n_kv*head_dim], f32 or bf16
  int64_t layer = 0;
  const float* q = nullptr;  // [T, n_heads*head_dim] after q-norm and RoPE
  float* ctx = nullptr;      // out [T, n_heads*head_dim]
  int64_t n_heads = 0, n_kv = 0, head_dim = 0;
  float scale = 1.f;
};

void gqa_attend(const GqaAttendArgs& a);

// The plain loop (one query and head at a time), kept as the reference the tests compare against.
void gqa_attend_reference(const GqaAttendArgs& a);
// Softmax of sc[0..n) in place: f32, max-subtracted, sequential sum (as torch.softmax);
// the one the GQA kernels use, for the other attention paths (MLA).
void softmax_inplace(float* sc, int64_t n);

}  // namespace moe
