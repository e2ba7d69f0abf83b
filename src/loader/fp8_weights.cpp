#include "loader/fp8_weights.h"

#include <fmt/format.h>

#include <cstring>

#include "core/check.h"
#include "loader/shard.h"

namespace moe {

namespace {

struct Fp8Read {
  Tensor w;      // f8e4m3 [n, k]: this read's codes
  Tensor scale;  // [n / block_n, k / block_k]
};

Fp8Read load_codes(const Checkpoint& ck, const LayerRead& r) {
  MOE_CHECK(r.size == 1, "tensor '{}': fp8 block-scaled weights under MoE-TP (--tp > 1) are not supported yet", r.key);
  MOE_CHECK(is_fp8_weight(ck, r.key), "tensor '{}' in {}: expected f8_e4m3 with '{}_scale_inv' like the other experts",
            r.key, ck.file_of(r.key), r.key);
  const std::string skey = r.key + "_scale_inv";
  Fp8Read out;
  out.w = load_sharded(ck, r.key, r.full_shape, r.rule, r.rank, r.size);
  out.scale = load_sharded(ck, skey, ck.info(skey).shape, ShardRule::replicated(), 0, 1);
  return out;
}

// Rows of `top` then `bottom` (same dtype and columns): gate over up, for W13.
Tensor stack(const Tensor& top, const Tensor& bottom) {
  MOE_CHECK(top.ndim() == 2 && bottom.ndim() == 2 && top.dim(1) == bottom.dim(1) && top.dtype() == bottom.dtype(),
            "cannot stack {} over {}", top.describe(), bottom.describe());
  Tensor out = Tensor::empty({top.dim(0) + bottom.dim(0), top.dim(1)}, top.dtype());
  const Tensor t = top.is_contiguous() ? top : top.clone(), b = bottom.is_contiguous() ? bottom : bottom.clone();
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  std::memcpy(static_cast<char*>(out.raw()) + t.nbytes(), b.raw(), b.nbytes());
  return out;
}

void pack_or_name(const Checkpoint& ck, const std::string& key, PackedExperts& p, int64_t e, const Tensor& w,
                  const Tensor& s, int64_t block_n) {
  try {
    pack_expert_fp8(p, e, w, s, block_n);
  } catch (const Error& err) {
    throw Error(fmt::format("{} (tensor '{}' in {}, scales '{}_scale_inv')", err.what(), key, ck.file_of(key), key));
  }
}

}  // namespace

std::pair<int64_t, int64_t> fp8_block_shape(const Checkpoint& ck) {
  int64_t bn = 128, bk = 128;
  const auto& cfg = ck.config();
  if (cfg.contains("quantization_config") && cfg["quantization_config"].contains("weight_block_size")) {
    const auto& b = cfg["quantization_config"]["weight_block_size"];
    MOE_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(),
              "config.json: quantization_config.weight_block_size must be [rows, cols], got {}", b.dump());
    bn = b[0].get<int64_t>();
    bk = b[1].get<int64_t>();
    MOE_CHECK(bn > 0 && bk > 0, "config.json: quantization_config.weight_block_size must be positive, got {}",
              b.dump());
  }
  return {bn, bk};
}

bool is_fp8_weight(const Checkpoint& ck, const std::string& key) {
  return ck.has(key) && ck.info(key).dtype == DType::F8E4M3 && ck.has(key + "_scale_inv");
}

void make_fp8_mlp(const Checkpoint& ck, int64_t n_experts, int64_t I, int64_t H, PackedExperts& w13,
                  PackedExperts& w2) {
  const int64_t bk = fp8_block_shape(ck).second;
  w13 = make_packed_experts_fp8(n_experts, 2 * I, H, /*gated=*/true, bk);
  w2 = make_packed_experts_fp8(n_experts, H, I, /*gated=*/false, bk);
}

void pack_fp8_expert(const Checkpoint& ck, const LayerRead& gate, const LayerRead& up, const LayerRead& down,
                     PackedExperts& w13, PackedExperts& w2, int64_t e) {
  const int64_t bn = fp8_block_shape(ck).first;
  const Fp8Read g = load_codes(ck, gate), u = load_codes(ck, up), d = load_codes(ck, down);
  const int64_t bk = fp8_block_shape(ck).second;
  for (const auto* r : {&gate, &up, &down}) {
    const Shape& sh = r->full_shape;
    const Shape want = {sh[0] / bn, sh[1] / bk};
    const Shape got = ck.info(r->key + "_scale_inv").shape;
    MOE_CHECK(sh[0] % bn == 0 && sh[1] % bk == 0,
              "fp8 weight '{}' {} in {}: the block shape [{}, {}] does not divide it (weight_block_size must divide "
              "every quantised weight; scales '{}_scale_inv')",
              r->key, shape_str(sh), ck.file_of(r->key), bn, bk, r->key);
    MOE_CHECK(got == want, "fp8 weight '{}' in {}: weight_scale_inv has shape {}, expected {} (one scale per [{}, {}] block)",
              r->key, ck.file_of(r->key), shape_str(got), shape_str(want), bn, bk);
  }
  // Gate and up each hold whole row blocks (pack_expert_fp8 checks I % block_n), so their
  // scales stack like their rows.
  pack_or_name(ck, gate.key, w13, e, stack(g.w, u.w), stack(g.scale.to(DType::F32), u.scale.to(DType::F32)), bn);
  pack_or_name(ck, down.key, w2, e, d.w, d.scale, bn);
}

}  // namespace moe
