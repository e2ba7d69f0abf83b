// Packing expert weights into the grouped-GEMM layout (grouped_gemm_impl.h) and back.
//
// pack_expert / pack_expert_gated read the source rows in their own dtype (bf16, f16 or
// f32: the checkpoint's, often a zero-copy view of the mmapped file) and write each
// panel exactly once, padding included, as a cache-blocked 32-bit transpose (see
// pack_impl.h): no f32 copy of the expert, no stacked gate+up copy. The bits are those
// of converting to f32 and then to the packed dtype: bf16 -> bf16 moves bits (a
// signalling NaN leaves quiet, as f32_to_bf16 makes every NaN); f32/f16 -> bf16 rounds
// to nearest even exactly as f32_to_bf16 (core/dtype.h); bf16/f16 -> f32 is exact.
// The vector panel packers are in pack_avx512.cpp and pack_avx2.cpp.
//
// The I8 (W8A8) packing, which quantises, lives in grouped_gemm_int8.cpp.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_impl.h"
#include "kernels/pack_impl.h"

namespace moe {

using gg::kPanel;

namespace gg {

namespace {

// Element i of a source row of dtype S (unaligned: rows of mmapped data), as f32 / bf16.
template <DType S>
float src_f32(const void* row, int64_t i) {
  if constexpr (S == DType::F32) {
    float f;
    std::memcpy(&f, static_cast<const char*>(row) + 4 * i, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(row) + 2 * i, 2);
    return S == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

template <DType S>
uint16_t src_bf16(const void* row, int64_t i) {
  if constexpr (S == DType::BF16) {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(row) + 2 * i, 2);
    // bf16 -> bf16 moves bits, except that a NaN leaves quiet (bit 6 set), as the
    // f32 round trip through f32_to_bf16 does.
    return (h & 0x7fffu) > 0x7f80u ? static_cast<uint16_t>(h | 0x40u) : h;
  } else {
    return f32_to_bf16(src_f32<S>(row, i));
  }
}

// Packed word of step s of one source row: for a bf16 panel the pair (2s, 2s+1) of
// bf16 values (lo, hi; hi = 0 past an odd K), for an f32 panel the f32 bits of element s.
template <DType S, DType D>
uint32_t packed_word(const void* row, int64_t s, int64_t k) {
  if constexpr (D == DType::BF16) {
    const uint32_t lo = src_bf16<S>(row, 2 * s);
    const uint32_t hi = 2 * s + 1 < k ? src_bf16<S>(row, 2 * s + 1) : 0u;
    return lo | hi << 16;
  } else {
    const float f = src_f32<S>(row, s);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
}

template <DType S, DType D>
void pack_panel_portable_t(const PanelPack& pp, int64_t s_begin, int64_t s_end) {
  // A tile of 64 columns x kBlock steps (4 KiB of words) is read row by row, then
  // written panel row by panel row: both sides stay within L1 (32 KiB or more on every
  // x86 core) and every panel row (256 bytes) is written whole.
  constexpr int kBlock = 16;
  uint32_t* out = static_cast<uint32_t*>(pp.out);
  uint32_t tile[kPanel][kBlock];
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kBlock) {
    const int ns = static_cast<int>(std::min<int64_t>(kBlock, s_end - s0));
    for (int j = 0; j < kPanel; ++j)
      for (int s = 0; s < ns; ++s) tile[j][s] = pp.rows[j] ? packed_word<S, D>(pp.rows[j], s0 + s, pp.k) : 0u;
    for (int s = 0; s < ns; ++s)
      for (int j = 0; j < kPanel; ++j) out[(s0 + s) * kPanel + j] = tile[j][s];
  }
}

}  // namespace

void pack_panel_portable_steps(const PanelPack& pp, int64_t s0, int64_t s1) {
  const bool bf = pp.dst == DType::BF16;
  switch (pp.src) {
    case DType::F32: return bf ? pack_panel_portable_t<DType::F32, DType::BF16>(pp, s0, s1)
                               : pack_panel_portable_t<DType::F32, DType::F32>(pp, s0, s1);
    case DType::BF16: return bf ? pack_panel_portable_t<DType::BF16, DType::BF16>(pp, s0, s1)
                                : pack_panel_portable_t<DType::BF16, DType::F32>(pp, s0, s1);
    case DType::F16: return bf ? pack_panel_portable_t<DType::F16, DType::BF16>(pp, s0, s1)
                               : pack_panel_portable_t<DType::F16, DType::F32>(pp, s0, s1);
    default: MOE_FAIL("pack: source dtype {} is not f32, bf16 or f16", dtype_name(pp.src));
  }
}

void pack_panel_portable(const PanelPack& pp) { pack_panel_portable_steps(pp, 0, pack_steps(pp)); }

}  // namespace gg

namespace {

// Rows of a 2-D source: row r starts at base + r * stride bytes.
struct RowSource {
  const char* base = nullptr;
  int64_t stride = 0;  // bytes
  DType dtype = DType::F32;
};

// A [rows, k] source readable row by row without a copy: the tensor itself when its
// rows are contiguous (any row stride), else a contiguous copy held in `hold`.
RowSource row_source(const Tensor& w, Tensor& hold) {
  const Tensor* t = &w;
  if (w.dim(1) > 1 && w.strides()[1] != 1) {
    hold = w.clone();
    t = &hold;
  }
  return {static_cast<const char*>(t->raw()), t->strides()[0] * static_cast<int64_t>(dtype_size(t->dtype())),
          t->dtype()};
}

// Writes every panel of expert e (float dtypes). Logical row r (panel_col_to_row) is
// row r of `top` for r < top_rows, else row r - top_rows of `bottom`: gated weights
// pass gate and up separately, plain ones the whole matrix as `top`.
void pack_rows(PackedExperts& p, int64_t e, const RowSource& top, int64_t top_rows, const RowSource& bottom) {
  gg::PanelPack pp;
  pp.src = top.dtype;
  pp.dst = p.dtype;
  pp.k = p.k;
  const Isa isa = active_isa();
  const bool avx512 = isa >= Isa::Avx512, avx2 = isa == Isa::Avx2;
  const int64_t np = gg::n_panels(p.n, p.gated), pe = gg::panel_elems(p.k, p.dtype);
  char* base = static_cast<char*>(p.data.raw()) + (e * p.expert_stride) * dtype_size(p.dtype);
  // Panels are whole multiples of 256 bytes, so this holds for every panel when it holds
  // for the slot; the AVX-512 packer's streaming stores fault on anything less.
  MOE_CHECK(reinterpret_cast<uintptr_t>(base) % 64 == 0, "pack: packed storage of expert {} is not 64-byte aligned",
            e);
  for (int64_t P = 0; P < np; ++P) {
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = gg::panel_col_to_row(p, P, j);
      pp.rows[j] = row < 0           ? nullptr
                   : row < top_rows ? top.base + row * top.stride
                                    : bottom.base + (row - top_rows) * bottom.stride;
    }
    pp.out = base + P * pe * dtype_size(p.dtype);
    if (avx512)
      gg::pack_panel_avx512(pp);
    else if (avx2)
      gg::pack_panel_avx2(pp);
    else
      gg::pack_panel_portable(pp);
  }
  if (avx512) gg::pack_fence_avx512();
  if (avx2) gg::pack_fence_avx2();
}

void check_source(const PackedExperts& p, int64_t e, const Tensor& w, int64_t rows, const char* what) {
  MOE_CHECK(0 <= e && e < p.n_experts, "{}: expert {} out of range [0, {})", what, e, p.n_experts);
  MOE_CHECK(w.ndim() == 2 && w.dim(0) == rows && w.dim(1) == p.k, "{}: expected weight [{}, {}], got {}", what, rows,
            p.k, w.describe());
  MOE_CHECK(w.dtype() == DType::F32 || w.dtype() == DType::BF16 || w.dtype() == DType::F16,
            "{}: weight dtype must be f32, bf16 or f16, got {}", what, dtype_name(w.dtype()));
}

}  // namespace

void pack_expert(PackedExperts& p, int64_t e, const Tensor& w) {
  MOE_CHECK(0 <= e && e < p.n_experts, "pack_expert: expert {} out of range [0, {})", e, p.n_experts);
  MOE_CHECK(w.ndim() == 2 && w.dim(0) == p.n && w.dim(1) == p.k, "pack_expert: expected weight [{}, {}], got {}",
            p.n, p.k, w.describe());
  if (p.int4_group > 0) return gg::pack_expert_i4(p, e, w);
  if (p.dtype == DType::I8) return gg::pack_expert_i8(p, e, w);
  MOE_CHECK(p.dtype != DType::F8E4M3, "pack_expert: f8e4m3 experts are packed from e4m3 codes with pack_expert_fp8");
  check_source(p, e, w, p.n, "pack_expert");
  Tensor hold;
  const RowSource src = row_source(w, hold);
  pack_rows(p, e, src, p.n, src);
}

void pack_expert_gated(PackedExperts& p, int64_t e, const Tensor& gate, const Tensor& up) {
  MOE_CHECK(p.gated, "pack_expert_gated: the packed weights are not gated (W13)");
  MOE_CHECK(p.dtype != DType::F8E4M3, "pack_expert_gated: f8e4m3 experts are packed with pack_expert_fp8");
  const int64_t half = p.n / 2;
  check_source(p, e, gate, half, "pack_expert_gated (gate)");
  check_source(p, e, up, half, "pack_expert_gated (up)");
  MOE_CHECK(gate.dtype() == up.dtype(), "pack_expert_gated: gate and up projections have different dtypes ({} vs {})",
            dtype_name(gate.dtype()), dtype_name(up.dtype()));
  if (p.dtype == DType::I8 && p.int4_group == 0) {
    // W8A8 quantises row by row (grouped_gemm_int8.cpp): gate and up as they are.
    Tensor hold_g, hold_u;
    const RowSource g = row_source(gate, hold_g), u = row_source(up, hold_u);
    gg::FloatRows rows;
    rows.top = g.base;
    rows.top_stride = g.stride;
    rows.top_rows = half;
    rows.bottom = u.base;
    rows.bottom_stride = u.stride;
    rows.dtype = g.dtype;
    return gg::pack_expert_i8_rows(p, e, rows);
  }
  if (p.dtype == DType::I8) {
    // int4 groups quantise whole f32 rows of the stacked expert (grouped_gemm_int4.cpp).
    Tensor w = Tensor::empty({p.n, p.k}, DType::F32);
    const size_t half_elems = static_cast<size_t>(half * p.k);
    const Tensor g = gate.is_contiguous() ? gate : gate.clone(), u = up.is_contiguous() ? up : up.clone();
    convert_to_f32(g.raw(), g.dtype(), w.data<float>(), half_elems);
    convert_to_f32(u.raw(), u.dtype(), w.data<float>() + half_elems, half_elems);
    return gg::pack_expert_i4(p, e, w);
  }
  Tensor hold_g, hold_u;
  pack_rows(p, e, row_source(gate, hold_g), half, row_source(up, hold_u));
}

Tensor zeroed_huge_pages(const Shape& shape, DType dtype) {
  constexpr size_t kHuge = size_t(2) << 20;  // x86-64 transparent huge page size
  int64_t numel = 1;
  for (int64_t d : shape) {
    MOE_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    numel *= d;
  }
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  if (bytes < kHuge) return Tensor::zeros(shape, dtype);
  // One huge page more than needed, so the data can start on a 2 MiB boundary and every
  // page of it can be a huge one; the unused head and tail are never touched (no memory).
  const size_t len = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;
  void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  MOE_CHECK(base != MAP_FAILED, "cannot map {} bytes for packed weights: out of memory?", bytes);
  std::shared_ptr<void> keep(base, [len](void* q) { munmap(q, len); });
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  void* data = reinterpret_cast<void*>((b + kHuge - 1) & ~(uintptr_t(kHuge) - 1));
  advise_huge_pages(data, bytes);
  return Tensor::wrap(data, shape, dtype, std::move(keep));
}

Tensor unpack_expert(const PackedExperts& p, int64_t e) {
  MOE_CHECK(0 <= e && e < p.n_experts, "unpack_expert: expert {} out of range [0, {})", e, p.n_experts);
  if (p.int4_group > 0) {
    const Tensor packed = gg::unpack_expert_i4(p, e);
    if (!p.in_perm.defined()) return packed;
    // Act-order: packed column j is input column in_perm[e][j].
    Tensor out = Tensor::zeros({p.n, p.k}, DType::F32);
    const int32_t* perm = p.in_perm.data<int32_t>() + e * p.k;
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t j = 0; j < p.k; ++j) out.data<float>()[n * p.k + perm[j]] = packed.data<float>()[n * p.k + j];
    return out;
  }
  if (p.dtype == DType::I8) return gg::unpack_expert_i8(p, e);
  if (p.dtype == DType::F8E4M3) return gg::unpack_expert_f8(p, e);
  Tensor out = Tensor::zeros({p.n, p.k}, DType::F32);
  float* dst = out.data<float>();
  const int64_t np = gg::n_panels(p.n, p.gated), pe = gg::panel_elems(p.k, p.dtype), K = p.k;
  for (int64_t P = 0; P < np; ++P) {
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = gg::panel_col_to_row(p, P, j);
      if (row < 0) continue;
      float* wr = dst + row * K;
      if (p.dtype == DType::F32) {
        const float* s = p.data.data<float>() + e * p.expert_stride + P * pe;
        for (int64_t k = 0; k < K; ++k) wr[k] = s[k * kPanel + j];
      } else {
        const uint16_t* s = p.data.data<uint16_t>() + e * p.expert_stride + P * pe;
        for (int64_t k = 0; k < K; ++k) wr[k] = bf16_to_f32(s[((k / 2) * kPanel + j) * 2 + (k & 1)]);
      }
    }
  }
  return out;
}

}  // namespace moe
