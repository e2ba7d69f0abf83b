#include "kernels/permute.h"

#include <cstring>

#include "core/check.h"

namespace moe {

void gen_idx(const int32_t* ids, int64_t T, int64_t k, int64_t E, RouteIndex& out) {
  const int64_t n = T * k;
  out.n_tokens = T;
  out.top_k = k;
  out.n_experts = E;
  out.counts.assign(E, 0);
  out.offsets.assign(E + 1, 0);
  out.gather_idx.resize(n);
  out.sorted_slot.resize(n);
  out.combine_idx.resize(n);
  for (int64_t s = 0; s < n; ++s) {
    const int32_t e = ids[s];
    MOE_CHECK(e >= 0 && e < E, "expert id {} of token {} is outside [0, {})", e, s / k, E);
    ++out.counts[e];
  }
  for (int64_t e = 0; e < E; ++e) out.offsets[e + 1] = out.offsets[e] + out.counts[e];
  thread_local std::vector<int64_t> cursor;  // reused: gen_idx runs per MoE layer per step
  cursor.assign(out.offsets.begin(), out.offsets.end() - 1);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t pos = cursor[ids[s]]++;
    out.sorted_slot[pos] = static_cast<int32_t>(s);
    out.gather_idx[pos] = static_cast<int32_t>(s / k);
    out.combine_idx[s] = static_cast<int32_t>(pos);
  }
}

void expand(const ExpandParams& p) {
  const RouteIndex& idx = *p.index;
  MOE_CHECK(0 <= p.expert_begin && p.expert_begin <= p.expert_end && p.expert_end <= idx.n_experts,
            "expand: expert range [{}, {}) outside [0, {})", p.expert_begin, p.expert_end, idx.n_experts);
  MOE_CHECK(p.out_dtype == DType::F32 || p.out_dtype == DType::BF16, "expand: output must be f32 or bf16");
  const int64_t first = idx.offsets[p.expert_begin];
  const int64_t rows = idx.rows_in(p.expert_begin, p.expert_end);
  const size_t in_row = static_cast<size_t>(p.ldx) * dtype_size(p.x_dtype);
  const size_t out_row = static_cast<size_t>(p.hidden) * dtype_size(p.out_dtype);
  const auto* x = static_cast<const char*>(p.x);
  auto* out = static_cast<char*>(p.out);
#pragma omp parallel for schedule(static) if (rows * p.hidden >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const char* src = x + idx.gather_idx[first + r] * in_row;
    char* dst = out + r * out_row;
    if (p.x_dtype == p.out_dtype) {
      std::memcpy(dst, src, out_row);
    } else if (p.x_dtype == DType::F32) {
      convert_from_f32(reinterpret_cast<const float*>(src), dst, p.out_dtype, p.hidden);
    } else if (p.out_dtype == DType::F32) {
      convert_to_f32(src, p.x_dtype, reinterpret_cast<float*>(dst), p.hidden);
    } else {
      MOE_FAIL("expand: cannot convert {} rows to {}", dtype_name(p.x_dtype), dtype_name(p.out_dtype));
    }
  }
}

void combine(const CombineParams& p) {
  const RouteIndex& idx = *p.index;
  const int64_t T = idx.n_tokens, k = idx.top_k, H = p.hidden;
#pragma omp parallel for schedule(static) if (T * k * H >= (1 << 16))
  for (int64_t t = 0; t < T; ++t) {
    float* y = p.y + t * H;
    if (!p.accumulate) std::memset(y, 0, H * sizeof(float));
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = p.ids[t * k + j];
      if (e < p.expert_begin || e >= p.expert_end) continue;
      const float w = p.weights[t * k + j];
      const float* row = p.expert_out + (idx.combine_idx[t * k + j] - p.pos_base) * H;
      for (int64_t h = 0; h < H; ++h) y[h] += w * row[h];
    }
  }
}

}  // namespace moe
