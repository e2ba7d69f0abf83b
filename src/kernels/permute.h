// Permutation of token slots by expert: gen_idx, expand, combine.
//
// A "slot" is one (token t, choice j) pair, numbered s = t * k + j. gen_idx sorts
// the T*k slots by expert with a stable counting sort, so inside one expert the
// slots stay in (t, j) order and every run gives the same layout.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace moe {

struct RouteIndex {
  int64_t n_tokens = 0;
  int64_t top_k = 0;
  int64_t n_experts = 0;
  std::vector<int32_t> gather_idx;   // [T*k] sorted position -> source token
  std::vector<int32_t> sorted_slot;  // [T*k] sorted position -> slot s = t*k + j
  std::vector<int32_t> combine_idx;  // [T*k] slot s -> sorted position (inverse of sorted_slot)
  std::vector<int64_t> counts;       // [E] slots per expert
  std::vector<int64_t> offsets;      // [E+1] prefix sums of counts

  // Sorted positions [offsets[b], offsets[e]) hold the slots of experts [b, e).
  int64_t rows_in(int64_t expert_begin, int64_t expert_end) const {
    return offsets[expert_end] - offsets[expert_begin];
  }
};

// ids: [T, k] expert ids in [0, n_experts). Throws on an id out of range.
void gen_idx(const int32_t* ids, int64_t n_tokens, int64_t top_k, int64_t n_experts, RouteIndex& out);

struct ExpandParams {
  const void* x = nullptr;  // [T, H] source rows
  DType x_dtype = DType::F32;
  int64_t hidden = 0;        // H
  int64_t ldx = 0;           // elements between source rows
  const RouteIndex* index = nullptr;
  int64_t expert_begin = 0;  // expand only the slots of experts [begin, end)
  int64_t expert_end = 0;
  void* out = nullptr;  // [index->rows_in(begin, end), H], contiguous
  DType out_dtype = DType::F32;  // F32 or BF16 (rounded to nearest even)
};
// out[r] = x[gather_idx[offsets[begin] + r]] converted to out_dtype. Ragged: only
// the rows of the given experts are touched (never masked zero rows).
void expand(const ExpandParams& p);

struct CombineParams {
  const float* expert_out = nullptr;  // [rows, H] f32, row r = sorted position pos_base + r
  int64_t pos_base = 0;               // sorted position of expert_out's row 0
  int64_t expert_begin = 0;           // slots whose expert lies in [begin, end) are summed
  int64_t expert_end = 0;
  const int32_t* ids = nullptr;       // [T, k]
  const float* weights = nullptr;     // [T, k]
  const RouteIndex* index = nullptr;
  int64_t hidden = 0;
  float* y = nullptr;                 // [T, H] f32
  bool accumulate = false;            // y += sum (e.g. onto a residual) instead of y = sum
};
// y[t] (+)= sum_{j = 0..k-1, expert in range} weights[t, j] * expert_out[pos(t, j)],
// summed in slot order j, so the result does not depend on where experts ran.
void combine(const CombineParams& p);

}  // namespace moe
