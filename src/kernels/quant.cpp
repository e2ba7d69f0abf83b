// Quantisation helpers (see quant.h): the scalar definitions, row/expand drivers and
// the FP8 E4M3 block dequantisation. The vector row quantisers are in quant_avx512.cpp and
// quant_avx2.cpp.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"

namespace moe {

float q8_row_scale(const void* row, int64_t k) {
  float s;
  std::memcpy(&s, static_cast<const char*>(row) + q8_scale_offset(k), 4);
  return s;
}

namespace {

// The clamp mirrors vmaxps/vminps operand by operand (a NaN becomes -127, as in the
// vector path), so no NaN reaches the float -> int conversion.
inline int8_t q8_clamp(float r) {
  r = r > -127.0f ? r : -127.0f;
  r = r < 127.0f ? r : 127.0f;
  return static_cast<int8_t>(static_cast<int32_t>(r));
}
inline int8_t q8_round(float v, float inv) { return q8_clamp(std::nearbyint(v * inv)); }

// One row with the dynamic rule (static_scale null) or the static one.
inline void quantize_row_any(const float* x, const float* smooth, int64_t k, const float* static_scale, void* dst) {
  if (static_scale)
    quantize_row_q8_static(x, smooth, k, *static_scale, dst);
  else
    quantize_row_q8(x, smooth, k, dst);
}

}  // namespace

void quantize_row_q8_reference(const float* x, const float* smooth, int64_t k, void* dst) {
  auto* q = static_cast<int8_t*>(dst);
  thread_local std::vector<float> v;
  v.resize(k);
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    v[i] = smooth ? x[i] / smooth[i] : x[i];
    const float a = std::fabs(v[i]);
    amax = a > amax ? a : amax;
  }
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const float scale = amax / 127.0f;
  for (int64_t i = 0; i < k; ++i) q[i] = q8_round(v[i], inv);
  for (int64_t i = k; i < q8_scale_offset(k); ++i) q[i] = 0;
  std::memcpy(q + q8_scale_offset(k), &scale, 4);
}

void quantize_row_q8(const float* x, const float* smooth, int64_t k, void* dst) {
  if (active_isa() >= Isa::Avx512)
    quant_detail::quantize_row_q8_avx512(x, smooth, k, dst);
  else if (active_isa() == Isa::Avx2)
    quant_detail::quantize_row_q8_avx2(x, smooth, k, dst);
  else
    quantize_row_q8_reference(x, smooth, k, dst);
}

void quantize_row_q8_static_reference(const float* x, const float* smooth, int64_t k, float s, void* dst) {
  auto* q = static_cast<int8_t*>(dst);
  for (int64_t i = 0; i < k; ++i) q[i] = q8_clamp(std::nearbyint((smooth ? x[i] / smooth[i] : x[i]) / s));
  for (int64_t i = k; i < q8_scale_offset(k); ++i) q[i] = 0;
  std::memcpy(q + q8_scale_offset(k), &s, 4);
}

void quantize_row_q8_static(const float* x, const float* smooth, int64_t k, float s, void* dst) {
  MOE_DCHECK(s > 0.0f && std::isfinite(s));
  if (active_isa() >= Isa::Avx512)
    quant_detail::quantize_row_q8_static_avx512(x, smooth, k, s, dst);
  else if (active_isa() == Isa::Avx2)
    quant_detail::quantize_row_q8_static_avx2(x, smooth, k, s, dst);
  else
    quantize_row_q8_static_reference(x, smooth, k, s, dst);
}

float quantize_weight_row(const float* w, int64_t k, int8_t* q) {
  for (int64_t i = 0; i < k; ++i)
    MOE_CHECK(std::isfinite(w[i]), "quantize: weight value {} at column {} is not finite", w[i], i);
  // The activation rule without a smooth vector: the same bits, and the vector path.
  thread_local std::vector<char> row;
  row.resize(q8_row_bytes(k));
  quantize_row_q8(w, nullptr, k, row.data());
  const float scale = q8_row_scale(row.data(), k);
  MOE_CHECK(std::isfinite(scale), "quantize: weight row holds a non-finite value");
  std::memcpy(q, row.data(), k);
  return scale;
}

void quantize_rows_q8(const QuantizeRowsParams& p) {
  MOE_CHECK(p.ld_dst >= q8_row_bytes(p.k), "quantize_rows_q8: ld_dst {} < {}", p.ld_dst, q8_row_bytes(p.k));
  MOE_CHECK(p.x_dtype == DType::F32 || p.x_dtype == DType::BF16 || p.x_dtype == DType::F16,
            "quantize_rows_q8: input must be f32, bf16 or f16, got {}", dtype_name(p.x_dtype));
  if (p.rows <= 0) return;
  const size_t in_row = static_cast<size_t>(p.ldx) * dtype_size(p.x_dtype);
  const auto* x = static_cast<const char*>(p.x);
  auto* dst = static_cast<char*>(p.dst);
#pragma omp parallel if (p.rows * p.k >= (1 << 15))
  {
    std::vector<float> buf(p.x_dtype == DType::F32 ? 0 : p.k);
    int64_t e = 0;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      if (p.offsets && (p.smooth || p.static_scale) && (r < p.offsets[e] || r >= p.offsets[e + 1]))
        e = std::upper_bound(p.offsets, p.offsets + p.n_experts + 1, r) - p.offsets - 1;
      const float* sm = p.smooth ? p.smooth + e * p.k : nullptr;
      const float* ss = p.static_scale ? p.static_scale + e : nullptr;
      const char* src = x + r * in_row;
      const float* xf = reinterpret_cast<const float*>(src);
      if (p.x_dtype != DType::F32) {
        convert_to_f32(src, p.x_dtype, buf.data(), p.k);
        xf = buf.data();
      }
      quantize_row_any(xf, sm, p.k, ss, dst + r * p.ld_dst);
    }
  }
}

void expand_quantize_q8(const ExpandParams& p, const float* smooth, const float* static_scale) {
  const RouteIndex& idx = *p.index;
  MOE_CHECK(0 <= p.expert_begin && p.expert_begin <= p.expert_end && p.expert_end <= idx.n_experts,
            "expand: expert range [{}, {}) outside [0, {})", p.expert_begin, p.expert_end, idx.n_experts);
  MOE_CHECK(p.x_dtype == DType::F32 || p.x_dtype == DType::BF16 || p.x_dtype == DType::F16,
            "expand: input must be f32, bf16 or f16, got {}", dtype_name(p.x_dtype));
  const int64_t first = idx.offsets[p.expert_begin];
  const int64_t rows = idx.rows_in(p.expert_begin, p.expert_end);
  const int64_t H = p.hidden, n_e = p.expert_end - p.expert_begin;
  const size_t in_row = static_cast<size_t>(p.ldx) * dtype_size(p.x_dtype);
  const int64_t out_row = q8_row_bytes(H);
  const auto* x = static_cast<const char*>(p.x);
  auto* out = static_cast<char*>(p.out);
  const int64_t* off = idx.offsets.data() + p.expert_begin;  // absolute positions
#pragma omp parallel if (rows * H >= (1 << 15))
  {
    std::vector<float> buf(p.x_dtype == DType::F32 ? 0 : H);
    int64_t e = 0;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = first + r;
      if ((smooth || static_scale) && (pos < off[e] || pos >= off[e + 1]))
        e = std::upper_bound(off, off + n_e + 1, pos) - off - 1;
      const float* sm = smooth ? smooth + e * H : nullptr;
      const float* ss = static_scale ? static_scale + e : nullptr;
      const char* src = x + idx.gather_idx[pos] * in_row;
      const float* xf = reinterpret_cast<const float*>(src);
      if (p.x_dtype != DType::F32) {
        convert_to_f32(src, p.x_dtype, buf.data(), H);
        xf = buf.data();
      }
      quantize_row_any(xf, sm, H, ss, out + r * out_row);
    }
  }
}

float f8e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80) << 24;
  const uint32_t e = (b >> 3) & 0xf, m = b & 0x7;
  uint32_t u;
  if (e == 0xf && m == 0x7) {
    u = sign | 0x7fc00000u;  // NaN (e4m3fn has no infinities)
  } else if (e == 0) {
    if (m == 0) {
      u = sign;  // +-0
    } else {
      // Subnormal: m * 2^-9. Normalise: shift m until its top bit reaches position 3.
      int sh = 0;
      uint32_t mm = m;
      while (!(mm & 0x8)) {
        mm <<= 1;
        ++sh;
      }
      // value = 1.(mm & 7) * 2^(-6 - sh)
      u = sign | static_cast<uint32_t>(127 - 6 - sh) << 23 | (mm & 0x7) << 20;
    }
  } else {
    u = sign | (e - 7 + 127) << 23 | m << 20;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Tensor dequantize_fp8_blocks(const Tensor& w, const Tensor& scale_inv, int64_t bn, int64_t bk, DType out_dtype) {
  MOE_CHECK(w.dtype() == DType::F8E4M3 && w.ndim() == 2 && w.is_contiguous(),
            "fp8 weight: expected a contiguous f8e4m3 [n, k] tensor, got {}", w.describe());
  MOE_CHECK(bn > 0 && bk > 0, "fp8 weight: bad block shape [{}, {}]", bn, bk);
  MOE_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16, "fp8 dequantisation: output must be f32 or bf16");
  const int64_t n = w.dim(0), k = w.dim(1);
  MOE_CHECK(n % bn == 0 && k % bk == 0,
            "fp8 weight {}: the block shape [{}, {}] does not divide it (weight_block_size must divide every "
            "quantised weight)",
            w.describe(), bn, bk);
  const int64_t sn = n / bn, sk = k / bk;
  MOE_CHECK(scale_inv.ndim() == 2 && scale_inv.dim(0) == sn && scale_inv.dim(1) == sk,
            "fp8 weight {}: weight_scale_inv has shape {}, expected [{}, {}] (one scale per [{}, {}] block)",
            w.describe(), shape_str(scale_inv.shape()), sn, sk, bn, bk);
  const Tensor s = scale_inv.to(DType::F32);
  const float* sp = s.data<float>();
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  Tensor out = Tensor::empty({n, k}, out_dtype);
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = f8e4m3_to_f32(static_cast<uint8_t>(i));
#pragma omp parallel for schedule(static) if (n * k >= (1 << 18))
  for (int64_t i = 0; i < n; ++i) {
    const float* srow = sp + (i / bn) * sk;
    const uint8_t* wr = wp + i * k;
    if (out_dtype == DType::F32) {
      float* o = out.data<float>() + i * k;
      for (int64_t j = 0; j < k; ++j) o[j] = lut[wr[j]] * srow[j / bk];
    } else {
      uint16_t* o = out.data<uint16_t>() + i * k;
      for (int64_t j = 0; j < k; ++j) o[j] = f32_to_bf16(lut[wr[j]] * srow[j / bk]);
    }
  }
  return out;
}

}  // namespace moe
