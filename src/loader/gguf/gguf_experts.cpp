#include "loader/gguf/gguf_experts.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "loader/gguf/gguf_types.h"

namespace moe::gguf {

namespace {

constexpr int64_t kBlock = 32;  // Q4_0 weights per block (and per int4 group)

// This rank's slice of a Q4_0 tensor as int4 codes, zero points and scales: u U8
// [n, k], zero U8 [n, k / 32], scale F32 [n, k / 32] (the slice's shape).
struct Q4Slice {
  Tensor u, zero, scale;
};

Q4Slice read_slice(const Checkpoint& ck, const TensorRead& r) {
  const TensorInfo& info = ck.info(r.key);
  MOE_CHECK(info.shape == r.shape, "tensor '{}' in {} has shape {}, expected {}", r.key, ck.file_of(r.key),
            shape_str(info.shape), shape_str(r.shape));
  const ShardPlan p = plan_shard(r);
  MOE_CHECK(p.out_shape.size() == 2 && p.out_shape[1] % kBlock == 0, "tensor '{}' in {}: this rank's slice {} has "
            "rows that Q4_0's {}-weight blocks do not divide", r.key, ck.file_of(r.key), shape_str(p.out_shape),
            kBlock);
  const int64_t n = p.out_shape[0], k = p.out_shape[1], cols = info.shape.back();
  Q4Slice s{Tensor::empty({n, k}, DType::U8), Tensor::empty({n, k / kBlock}, DType::U8),
            Tensor::empty({n, k / kBlock}, DType::F32)};
  const Tensor raw = ck.view_raw(r.key);
  const uint64_t row_bytes = ggml_row_bytes(GgmlType::Q4_0, cols);
  uint8_t* u = s.u.data<uint8_t>();
  uint8_t* z = s.zero.data<uint8_t>();
  float* sc = s.scale.data<float>();
  std::vector<float> scale(static_cast<size_t>(cols / kBlock)), offset(scale.size());
  // A run's piece may span several whole rows (a contiguous slice is one piece): walk
  // each piece row by row.
  auto decompose = [&](int64_t b, int64_t len) {
    const int64_t row = b / cols, col = b % cols;
    MOE_CHECK(col % kBlock == 0 && len % kBlock == 0, "tensor '{}' in {}: this rank's slice cuts a Q4_0 block "
              "(columns [{}, {}) of a row); MoE-TP must slice on {}-weight boundaries", r.key, ck.file_of(r.key), col,
              col + len, kBlock);
    const uint8_t* src = raw.data<uint8_t>() + row * row_bytes + col / kBlock * ggml_type_info(GgmlType::Q4_0).block_bytes;
    decompose_row(GgmlType::Q4_0, src, len, {u, scale.data(), offset.data()});
    for (int64_t g = 0; g < len / kBlock; ++g) {
      const float d = scale[g];
      MOE_CHECK(std::isfinite(d), "tensor '{}' in {}: Q4_0 block {} of row {} has scale {}, expected a finite "
                "number", r.key, ck.file_of(r.key), col / kBlock + g, row, d);
      if (std::signbit(d)) {
        for (int64_t j = 0; j < kBlock; ++j) u[g * kBlock + j] = static_cast<uint8_t>(15 - u[g * kBlock + j]);
        z[g] = 7;
        sc[g] = -d;
      } else {
        z[g] = 8;
        sc[g] = d;
      }
    }
    u += len;
    z += len / kBlock;
    sc += len / kBlock;
  };
  for (const ShardRun& run : p.runs)
    for (int64_t i = 0; i < run.count; ++i)
      for (int64_t b = run.begin + i * run.stride, end = b + run.len; b < end;) {
        const int64_t len = std::min(end - b, cols - b % cols);
        decompose(b, len);
        b += len;
      }
  return s;
}

}  // namespace

bool is_q4_0(const Checkpoint& ck, const TensorRead& r) {
  return ck.has(r.key) && ck.info(r.key).ggml_type == static_cast<int32_t>(GgmlType::Q4_0);
}

void pack_q4_0_expert(const Checkpoint& ck, PackedExperts& w13, PackedExperts& w2, int64_t e, const TensorRead& gate,
                      const TensorRead& up, const TensorRead& down) {
  const Q4Slice g = read_slice(ck, gate), u = read_slice(ck, up), d = read_slice(ck, down);
  pack_gated_expert_q4(w13, w2, e, {g.u, g.zero, g.scale}, {u.u, u.zero, u.scale}, {d.u, d.zero, d.scale});
}

void pack_q4_0_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r) {
  const Q4Slice s = read_slice(ck, r);
  pack_expert_q4(w, e, s.u, s.zero, s.scale);
}

}  // namespace moe::gguf
