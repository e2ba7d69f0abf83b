// Expert slots piece by piece (kernels/grouped_gemm.h): what a rebalance sends between
// ranks and what placements copy between slots.
#include <array>
#include <cstring>

#include "core/check.h"
#include "kernels/grouped_gemm.h"

namespace moe {
namespace {

// The per-expert side tensors of p, in piece order; each undefined or [n_experts, ...].
template <class P>
auto side_tensors(P& p) {
  return std::array{&p.w_scale, &p.w_comp, &p.smooth, &p.act_scale, &p.w_zero, &p.w_offset, &p.w_sb_d, &p.w_sb_m, &p.w_sc, &p.w_mn,
                    &p.in_perm};
}

}  // namespace

std::vector<BytePiece> expert_pieces(const PackedExperts& p, int64_t e) {
  MOE_CHECK(e >= 0 && e < p.n_experts, "expert slot {} outside [0, {})", e, p.n_experts);
  std::vector<BytePiece> out;
  const size_t wb = p.bytes_per_expert();
  // The storage is shared (Tensor), so const here only means "this call writes nothing".
  out.push_back({static_cast<char*>(const_cast<void*>(p.data.raw())) + e * wb, wb});
  for (const Tensor* t : side_tensors(p)) {
    if (!t->defined()) continue;
    MOE_CHECK(t->dim(0) == p.n_experts && t->is_contiguous(),
              "packed experts: a side tensor {} does not hold one row per expert of {}", t->describe(), p.n_experts);
    const size_t rb = t->nbytes() / static_cast<size_t>(p.n_experts);
    out.push_back({static_cast<char*>(const_cast<void*>(t->raw())) + e * rb, rb});
  }
  return out;
}

void copy_expert(PackedExperts& dst, int64_t d, const PackedExperts& src, int64_t s) {
  const std::vector<BytePiece> to = expert_pieces(dst, d), from = expert_pieces(src, s);
  MOE_CHECK(to.size() == from.size() && dst.uniform_zero == src.uniform_zero,
            "copy_expert: the two packed experts have other formats");
  for (size_t i = 0; i < to.size(); ++i) {
    MOE_CHECK(to[i].bytes == from[i].bytes, "copy_expert: the two packed experts have other formats");
    std::memcpy(to[i].data, from[i].data, to[i].bytes);
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
