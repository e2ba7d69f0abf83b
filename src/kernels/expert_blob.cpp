// Expert slots as flat blobs (kernels/grouped_gemm.h): what a rebalance sends between
// ranks and copies between slots.
#include <array>
#include <cstring>

#include "core/check.h"
#include "kernels/grouped_gemm.h"

namespace moe {
namespace {

// The per-expert side tensors of p, in blob order; each undefined or [n_experts, ...].
template <class P>
auto side_tensors(P& p) {
  return std::array{&p.w_scale, &p.w_comp, &p.smooth, &p.act_scale, &p.w_zero};
}

size_t side_row_bytes(const PackedExperts& p, const Tensor& t) {
  if (!t.defined()) return 0;
  MOE_CHECK(p.n_experts > 0 && t.dim(0) == p.n_experts && t.is_contiguous(),
            "packed experts: a side tensor {} does not hold one row per expert of {}", t.describe(), p.n_experts);
  return t.nbytes() / static_cast<size_t>(p.n_experts);
}

}  // namespace

size_t expert_blob_bytes(const PackedExperts& p) {
  size_t b = p.bytes_per_expert();
  for (const Tensor* t : side_tensors(p)) b += side_row_bytes(p, *t);
  return b;
}

void read_expert_blob(const PackedExperts& p, int64_t e, void* dst) {
  MOE_CHECK(e >= 0 && e < p.n_experts, "expert slot {} outside [0, {})", e, p.n_experts);
  char* out = static_cast<char*>(dst);
  const size_t wb = p.bytes_per_expert();
  std::memcpy(out, static_cast<const char*>(p.data.raw()) + e * wb, wb);
  out += wb;
  for (const Tensor* t : side_tensors(p)) {
    const size_t rb = side_row_bytes(p, *t);
    if (rb) std::memcpy(out, static_cast<const char*>(t->raw()) + e * rb, rb);
    out += rb;
  }
}

void write_expert_blob(PackedExperts& p, int64_t e, const void* src) {
  MOE_CHECK(e >= 0 && e < p.n_experts, "expert slot {} outside [0, {})", e, p.n_experts);
  const char* in = static_cast<const char*>(src);
  const size_t wb = p.bytes_per_expert();
  std::memcpy(static_cast<char*>(p.data.raw()) + e * wb, in, wb);
  in += wb;
  for (Tensor* t : side_tensors(p)) {
    const size_t rb = side_row_bytes(p, *t);
    if (rb) std::memcpy(static_cast<char*>(t->raw()) + e * rb, in, rb);
    in += rb;
  }
}

PackedExperts make_packed_like(const PackedExperts& p, int64_t n_experts) {
  MOE_CHECK(n_experts >= 0, "packed experts: bad slot count {}", n_experts);
  PackedExperts q = p;  // scalars; every tensor is replaced below
  q.n_experts = n_experts;
  q.data = zeroed_huge_pages({n_experts * p.expert_stride}, p.dtype);
  auto src = side_tensors(p);
  auto dst = side_tensors(q);
  for (size_t i = 0; i < src.size(); ++i) {
    if (!src[i]->defined()) continue;
    Shape s = src[i]->shape();
    s[0] = n_experts;
    *dst[i] = Tensor::zeros(s, src[i]->dtype());
  }
  return q;
}

}  // namespace moe
