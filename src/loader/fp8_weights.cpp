#include "loader/fp8_weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "kernels/quant.h"

namespace moe {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool float_type(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// The widest even width dividing the slice's k whose blocks each lie inside one
// checkpoint block of width bk; 0 when there is none. `cols` are the slice's columns in
// the full tensor (shard_index_map). A contiguous slice starting at c0: every checkpoint
// boundary inside it must be a local one, so the width divides bk and c0 mod bk, and k.
int64_t local_block_k(const std::vector<int64_t>& cols, int64_t bk) {
  const int64_t k = static_cast<int64_t>(cols.size());
  if (k == 0) return 0;
  bool contiguous = true;
  for (int64_t j = 1; j < k && contiguous; ++j) contiguous = cols[j] == cols[0] + j;
  int64_t d = 0;
  if (contiguous) {
    // Within a single checkpoint block the whole slice is one local block.
    d = cols[0] / bk == cols[k - 1] / bk ? k : std::gcd(std::gcd(bk, cols[0] % bk), k);
  } else {
    for (int64_t c = std::min(k, bk) & ~int64_t{1}; c >= 2 && d == 0; c -= 2) {
      if (k % c) continue;
      bool ok = true;
      for (int64_t j = 0; j < k && ok; ++j) ok = cols[j] / bk == cols[j - j % c] / bk;
      if (ok) d = c;
    }
  }
  // An odd width has no even divisor: no usable blocking.
  if (d % 2) d = 0;
  return d;
}

struct Fp8Geometry {
  int64_t bn = 0, bk = 0;   // checkpoint block
  int64_t block_k = 0;      // this slice's
  Shape scale_shape;        // the checkpoint scale tensor's expected shape
};

// Header checks and the slice's block width; the error text, or nullopt and `g` filled.
std::optional<std::string> geometry(const Checkpoint& ck, const TensorRead& r, Fp8Geometry& g) {
  const TensorInfo& info = ck.info(r.key);
  const std::string file = ck.file_of(r.key);
  const QuantConfig qc = parse_quant_config(ck.config());
  if (qc.ignores(module_of(r.key)))
    return fmt::format("tensor '{}' in {} is f8_e4m3, but config.json's quantization_config lists its module '{}' as "
                       "not converted (modules_to_not_convert / ignored_layers)",
                       r.key, file, module_of(r.key));
  if (info.shape.size() != 2 && info.shape.size() != 3)
    return fmt::format("fp8 weight '{}' in {} has shape {}: expected a matrix [n, k] or stacked experts [E, n, k]",
                       r.key, file, shape_str(info.shape));
  const std::string skey = r.key + "_scale_inv";
  if (!ck.has(skey))
    return fmt::format("fp8 weight '{}' in {} has no block scales '{}' (an f8_e4m3 weight needs its weight_scale_inv)",
                       r.key, file, skey);
  const TensorInfo& si = ck.info(skey);
  if (!float_type(si.dtype))
    return fmt::format("fp8 block scales '{}' in {} have dtype {}, expected f32, bf16 or f16", skey,
                       ck.file_of(skey), dtype_name(si.dtype));
  g.bn = qc.block_n;
  g.bk = qc.block_k;
  const size_t nd = info.shape.size();
  g.scale_shape = info.shape;
  g.scale_shape[nd - 2] = ceil_div(info.shape[nd - 2], g.bn);
  g.scale_shape[nd - 1] = ceil_div(info.shape[nd - 1], g.bk);
  if (si.shape != g.scale_shape)
    return fmt::format("fp8 weight '{}' {} in {}: weight_scale_inv '{}' has shape {}, expected {} (one scale per "
                       "[{}, {}] block of weight_block_size, edge blocks partial)",
                       r.key, shape_str(info.shape), file, skey, shape_str(si.shape), shape_str(g.scale_shape), g.bn,
                       g.bk);
  const std::vector<int64_t> cols =
      shard_index_map(r.key, info.shape, r.rule, r.rank, r.size, static_cast<int>(nd) - 1);
  g.block_k = local_block_k(cols, g.bk);
  if (g.block_k == 0)
    return fmt::format("fp8 weight '{}' in {}: this rank's columns [{}, {}] (of {}, {} rank {} of {}) cut its "
                       "[{}, {}] scale blocks into odd widths; the FP8 GEMM needs even ones (a k pair shares one "
                       "scale): choose a --tp that splits the input dim on even offsets",
                       r.key, file, cols.empty() ? 0 : cols.front(), cols.empty() ? 0 : cols.back(),
                       info.shape[nd - 1], r.rule.describe(), r.rank, r.size, g.bn, g.bk);
  return std::nullopt;
}

// Same bounds as pack_expert_fp8: products of e4m3 values (2^-9 .. 448) and the scale stay
// in bf16's normal range, so every kernel's conversion gives the same bits.
constexpr float kMinScale = 0x1p-117f, kMaxScale = 0x1p100f;

}  // namespace

std::pair<int64_t, int64_t> fp8_block_shape(const Checkpoint& ck) {
  const QuantConfig qc = parse_quant_config(ck.config());
  return {qc.block_n, qc.block_k};
}

bool is_fp8_weight(const Checkpoint& ck, const std::string& key) {
  return ck.has(key) && ck.info(key).dtype == DType::F8E4M3;
}

std::optional<std::string> fp8_problem(const Checkpoint& ck, const TensorRead& r) {
  Fp8Geometry g;
  return geometry(ck, r, g);
}

int64_t fp8_slice_block_k(const Checkpoint& ck, const TensorRead& r) {
  Fp8Geometry g;
  if (auto p = geometry(ck, r, g)) throw_error(__FILE__, __LINE__, *p);
  return g.block_k;
}

Fp8Slice load_fp8_slice(const Checkpoint& ck, const TensorRead& r) {
  MOE_CHECK(is_fp8_weight(ck, r.key), "internal: '{}' is not an f8_e4m3 tensor", r.key);
  Fp8Geometry g;
  if (auto p = geometry(ck, r, g)) throw_error(__FILE__, __LINE__, *p);
  const Shape& full = ck.info(r.key).shape;
  const int nd = static_cast<int>(full.size());
  Fp8Slice s;
  s.key = r.key;
  s.block_k = g.block_k;
  s.codes = load_sharded(ck, r);  // e4m3 as stored: a view when contiguous
  const Tensor sc = load_sharded(ck, fp8_scale_read(r, g.scale_shape), DType::F32);  // [(E_l,) sn, sk]
  const std::vector<int64_t> rows = shard_index_map(r.key, full, r.rule, r.rank, r.size, nd - 2);
  const std::vector<int64_t> cols = shard_index_map(r.key, full, r.rule, r.rank, r.size, nd - 1);
  const int64_t E = nd == 3 ? s.codes.dim(0) : 1, n = static_cast<int64_t>(rows.size()),
                k = static_cast<int64_t>(cols.size()), nkb = k / g.block_k;
  const int64_t sn = g.scale_shape[nd - 2], sk = g.scale_shape[nd - 1];
  s.row_scale = nd == 3 ? Tensor::empty({E, n, nkb}, DType::F32) : Tensor::empty({n, nkb}, DType::F32);
  const float* src = sc.data<float>();
  float* dst = s.row_scale.data<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < nkb; ++b) {
        const int64_t si = rows[i] / g.bn, sj = cols[b * g.block_k] / g.bk;
        const float v = src[(e * sn + si) * sk + sj];
        const float a = std::fabs(v);
        MOE_CHECK(a == 0.0f || (a >= kMinScale && a <= kMaxScale),
                  "fp8 weight '{}' in {}: block scale {} at [{}{}, {}] of '{}_scale_inv' is outside [2^-117, 2^100] "
                  "(not finite, or its dequantised values would leave bf16's normal range)",
                  r.key, ck.file_of(r.key), v, nd == 3 ? fmt::format("{}, ", e) : "", si, sj, r.key);
        dst[(e * n + i) * nkb + b] = v;
      }
  return s;
}

Tensor dequantize_fp8(const Fp8Slice& s, DType out) {
  MOE_CHECK(out == DType::F32 || out == DType::BF16, "dequantize_fp8: out must be f32 or bf16, got {}",
            dtype_name(out));
  const Tensor c = s.codes.is_contiguous() ? s.codes : s.codes.clone();
  const int64_t k = s.cols(), nkb = k / s.block_k, rows = c.numel() / std::max<int64_t>(1, k);
  Tensor f = Tensor::empty(c.shape(), DType::F32);
  const auto* q = static_cast<const uint8_t*>(c.raw());
  const float* rs = s.row_scale.data<float>();
  float* o = f.data<float>();
  // NaN codes (0x7f / 0xff) have no value: a corrupt tensor. (The packed path's
  // pack_expert_fp8 checks the same, so each code is checked once either way.)
  for (int64_t i = 0; i < rows * k; ++i)
    MOE_CHECK((q[i] & 0x7f) != 0x7f, "fp8 weight '{}': NaN code 0x{:02x} at element {} of this rank's slice", s.key,
              q[i], i);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < k; ++j) o[i * k + j] = f8e4m3_to_f32(q[i * k + j]) * rs[i * nkb + j / s.block_k];
  if (out == DType::F32) return f;
  for (int64_t i = 0; i < f.numel(); ++i) o[i] = round_bf16(o[i]);  // RNE: the GEMM's values
  return f.to(DType::BF16);
}

PackedExperts make_packed_fp8(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t block_k) {
  return make_packed_experts_fp8(n_experts, n, k, gated, block_k);
}

namespace {

void pack_rows(PackedExperts& p, int64_t e, const Tensor& codes, const Tensor& row_scale, const std::string& key) {
  try {
    pack_expert_fp8(p, e, codes, row_scale, /*block_n=*/1);  // one scale row per row
  } catch (const Error& err) {
    throw Error(fmt::format("{} (tensor '{}', scales '{}_scale_inv')", err.what(), key, key));
  }
}

Tensor expert_of(const Tensor& t, int64_t e) {
  if (e < 0) return t;
  return t.slice_rows(e, e + 1).reshape({t.dim(1), t.dim(2)});
}

// Rows of `top` then `bottom` (same dtype and columns), contiguous.
Tensor stack_rows(const Tensor& top, const Tensor& bottom) {
  MOE_CHECK(top.ndim() == 2 && bottom.ndim() == 2 && top.dim(1) == bottom.dim(1) && top.dtype() == bottom.dtype(),
            "cannot stack {} over {}", top.describe(), bottom.describe());
  Tensor out = Tensor::empty({top.dim(0) + bottom.dim(0), top.dim(1)}, top.dtype());
  const Tensor t = top.is_contiguous() ? top : top.clone(), b = bottom.is_contiguous() ? bottom : bottom.clone();
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  std::memcpy(static_cast<char*>(out.raw()) + t.nbytes(), b.raw(), b.nbytes());
  return out;
}

}  // namespace

void pack_fp8(PackedExperts& p, int64_t e, const Fp8Slice& s, int64_t in_slice) {
  MOE_CHECK(s.block_k == p.block_k, "internal: fp8 slice '{}' has block_k {}, the packed weights {}", s.key, s.block_k,
            p.block_k);
  pack_rows(p, e, expert_of(s.codes, in_slice), expert_of(s.row_scale, in_slice), s.key);
}

void pack_fp8_gated(PackedExperts& p, int64_t e, const Fp8Slice& gate, const Fp8Slice& up) {
  MOE_CHECK(gate.block_k == p.block_k && up.block_k == p.block_k,
            "internal: fp8 slices '{}' / '{}' have block_k {} / {}, the packed weights {}", gate.key, up.key,
            gate.block_k, up.block_k, p.block_k);
  pack_rows(p, e, stack_rows(gate.codes, up.codes), stack_rows(gate.row_scale, up.row_scale), gate.key);
}

}  // namespace moe
