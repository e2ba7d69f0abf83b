// W8A8 grouped GEMM: int8 packing (per-output-channel quantisation, VNNI quads, scales
// and compensation), the scalar reference and the portable task runner. The AVX512-VNNI
// runner is in grouped_gemm_int8_avx512.cpp. Layout: grouped_gemm_impl.h.
//
// Portable runner: exact int32 sums of q_a * q_w (no +128 shift, so no compensation);
// the VNNI runner computes sum (q_a + 128) * q_w - 128 * sum q_w, the same integer.
// Both dequantise with the same IEEE operations ((float)acc * a_scale * w_scale, then
// the gated activation through ActMath), so every ISA gives the same bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_generic.h"
#include "kernels/grouped_gemm_impl.h"
#include "kernels/quant.h"

namespace moe {

namespace gg {

void alloc_q8(PackedExperts& p) {
  const int64_t cols = n_panels(p.n, p.gated) * kPanel;
  p.w_scale = Tensor::zeros({p.n_experts, cols}, DType::F32);
  p.w_comp = Tensor::zeros({p.n_experts, cols}, DType::I32);
}

namespace {

// Writes packed column j of panel P of expert e from one quantised row qr [k] and its scale.
void write_q8_column(PackedExperts& p, int64_t e, int64_t P, int j, const int8_t* qr, float scale) {
  const int64_t pe = panel_elems(p.k, DType::I8), K = p.k, cols = n_panels(p.n, p.gated) * kPanel;
  int8_t* dst = static_cast<int8_t*>(p.data.raw()) + e * p.expert_stride + P * pe;
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    dst[((k / 4) * kPanel + j) * 4 + (k & 3)] = qr[k];
    sum += qr[k];
  }
  p.w_scale.data<float>()[e * cols + P * kPanel + j] = scale;
  p.w_comp.data<int32_t>()[e * cols + P * kPanel + j] = 128 * sum;
}

// Writes expert e from q [n, k] and scale [n].
void pack_q8_rows(PackedExperts& p, int64_t e, const int8_t* q, const float* scale) {
  const int64_t np = n_panels(p.n, p.gated);
  for (int64_t P = 0; P < np; ++P)
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = panel_col_to_row(p, P, j);
      if (row >= 0) write_q8_column(p, e, P, j, q + row * p.k, scale[row]);
    }
}

}  // namespace

void pack_expert_i8_rows(PackedExperts& p, int64_t e, const FloatRows& rows) {
  const int64_t K = p.k, np = n_panels(p.n, p.gated);
  const float* smooth = p.smooth.defined() ? p.smooth.data<float>() + e * K : nullptr;
  std::vector<float> w(K);  // one row: the whole staging of this expert
  std::vector<int8_t> q(K);
  for (int64_t P = 0; P < np; ++P)
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = panel_col_to_row(p, P, j);
      if (row < 0) continue;
      convert_to_f32(rows.row(row), rows.dtype, w.data(), static_cast<size_t>(K));
      if (smooth)  // folded in before quantisation (SmoothQuant: w[n, k] * smooth[k])
        for (int64_t k = 0; k < K; ++k) w[k] *= smooth[k];
      write_q8_column(p, e, P, j, q.data(), quantize_weight_row(w.data(), K, q.data()));
    }
}

void pack_expert_i8(PackedExperts& p, int64_t e, const Tensor& w) {
  const Tensor c = w.dim(1) > 1 && w.strides()[1] != 1 ? w.clone() : w;  // rows of k contiguous values
  FloatRows rows;
  rows.top = static_cast<const char*>(c.raw());
  rows.top_stride = c.strides()[0] * static_cast<int64_t>(dtype_size(c.dtype()));
  rows.top_rows = p.n;
  rows.dtype = c.dtype();
  pack_expert_i8_rows(p, e, rows);
}

Tensor unpack_expert_i8(const PackedExperts& p, int64_t e) {
  Tensor q, s;
  unpack_expert_q8(p, e, q, s);
  Tensor out = Tensor::empty({p.n, p.k}, DType::F32);
  const int8_t* qp = q.data<int8_t>();
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < p.k; ++k) out.data<float>()[n * p.k + k] = qp[n * p.k + k] * s.data<float>()[n];
  return out;
}

void reference_i8(const GroupedGemmParams& p) {
  const PackedExperts& w = *p.w;
  const int64_t K = w.k, N = w.n, n_out = w.n_out();
  std::vector<float> acc(N);
  std::vector<int32_t> iacc(N);
  for (int64_t e = 0; e < w.n_experts; ++e) {
    const int64_t r0 = p.offsets[e], r1 = p.offsets[e + 1];
    if (r0 == r1) continue;
    Tensor q, s;
    unpack_expert_q8(w, e, q, s);
    const int8_t* W = q.data<int8_t>();
    const float* ws = s.data<float>();
    for (int64_t r = r0; r < r1; ++r) {
      const char* arow = static_cast<const char*>(p.a) + r * p.lda;
      const auto* qa = reinterpret_cast<const int8_t*>(arow);
      const float as = q8_row_scale(arow, K);
      for (int64_t n = 0; n < N; ++n) {
        int64_t sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += int32_t(qa[k]) * int32_t(W[n * K + k]);
        iacc[n] = static_cast<int32_t>(sum);
        acc[n] = static_cast<float>(iacc[n]) * as * ws[n];
      }
      char* crow = static_cast<char*>(p.c) + r * p.ldc * dtype_size(p.c_dtype);
      if (p.c_dtype == DType::I32) {
        std::memcpy(crow, iacc.data(), N * 4);
        continue;
      }
      if (w.gated)
        for (int64_t c = 0; c < n_out; ++c) acc[c] = act_gate(p.act, acc[c]) * acc[n_out + c];
      convert_from_f32(acc.data(), crow, p.c_dtype, n_out);
    }
  }
}

namespace {

constexpr int kI8MaxRows = 4;

// Epilogue of one row x one panel from exact int32 accumulators (packed column order).
inline void i8_epilogue_row(const Job& j, const int32_t* acc, float a_scale, const float* ws, char* crow,
                            int64_t col0, int nv) {
  if (j.c_dtype == DType::I32) {
    std::memcpy(reinterpret_cast<int32_t*>(crow) + col0, acc, nv * sizeof(int32_t));
    return;
  }
  float t[kPanel];
  for (int c = 0; c < kPanel; ++c) t[c] = static_cast<float>(acc[c]) * a_scale * ws[c];
  scalar_epilogue_row(j, t, crow, col0, nv);
}

}  // namespace

void run_task_portable_i8(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t S = (j.k + 3) / 4;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    const auto* panel = reinterpret_cast<const int8_t*>(j.w + t.expert * j.expert_stride + P * j.panel_stride);
    const float* ws = j.w_scale + t.expert * j.q_stride + P * kPanel;
    const int nv = valid_cols(j, P);
    for (int64_t rb = 0; rb < rows; rb += kI8MaxRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kI8MaxRows, rows - rb));
      int32_t acc[kI8MaxRows][kPanel] = {};
      for (int64_t s = 0; s < S; ++s) {
        const int8_t* b = panel + s * kPanel * 4;
        for (int r = 0; r < mr; ++r) {
          const int8_t* a = reinterpret_cast<const int8_t*>(j.a + (r0 + rb + r) * j.lda_bytes) + 4 * s;
          const int32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];  // pad bytes meet zero weights
          for (int c = 0; c < kPanel; ++c)
            acc[r][c] += a0 * b[4 * c] + a1 * b[4 * c + 1] + a2 * b[4 * c + 2] + a3 * b[4 * c + 3];
        }
      }
      for (int r = 0; r < mr; ++r) {
        const char* arow = j.a + (r0 + rb + r) * j.lda_bytes;
        float as;
        std::memcpy(&as, arow + j.a_scale_off, 4);
        i8_epilogue_row(j, acc[r], as, ws, j.c + (r0 + rb + r) * j.ldc_bytes, P * per, nv);
      }
    }
  }
}

}  // namespace gg

void pack_expert_q8(PackedExperts& p, int64_t e, const Tensor& q, const Tensor& scale) {
  MOE_CHECK(p.dtype == DType::I8, "pack_expert_q8: the packed experts are {}, not i8", dtype_name(p.dtype));
  MOE_CHECK(p.int4_group == 0, "pack_expert_q8: the packed experts are int4 (use pack_expert_q4)");
  MOE_CHECK(0 <= e && e < p.n_experts, "pack_expert_q8: expert {} out of range [0, {})", e, p.n_experts);
  MOE_CHECK(q.dtype() == DType::I8 && q.ndim() == 2 && q.dim(0) == p.n && q.dim(1) == p.k,
            "pack_expert_q8: expected an i8 weight [{}, {}], got {}", p.n, p.k, q.describe());
  MOE_CHECK(scale.numel() == p.n && (scale.ndim() == 1 || (scale.ndim() == 2 && scale.dim(1) == 1)),
            "pack_expert_q8: per-channel scale has shape {}, expected [{}] or [{}, 1]", shape_str(scale.shape()), p.n,
            p.n);
  const Tensor qc = q.clone(), sc = scale.to(DType::F32);
  for (int64_t i = 0; i < p.n; ++i)
    MOE_CHECK(std::isfinite(sc.data<float>()[i]) && sc.data<float>()[i] >= 0.0f,
              "pack_expert_q8: per-channel scale {} of expert {} is {} (must be finite and >= 0)", i, e,
              sc.data<float>()[i]);
  gg::pack_q8_rows(p, e, qc.data<int8_t>(), sc.data<float>());
}

void set_expert_smooth(PackedExperts& p, int64_t e, const Tensor& smooth) {
  MOE_CHECK(p.dtype == DType::I8, "smooth vectors belong to i8 (W8A8) weights, these are {}", dtype_name(p.dtype));
  MOE_CHECK(0 <= e && e < p.n_experts, "set_expert_smooth: expert {} out of range [0, {})", e, p.n_experts);
  MOE_CHECK(smooth.numel() == p.k, "smooth vector of expert {} has {} values ({}), expected {}", e, smooth.numel(),
            shape_str(smooth.shape()), p.k);
  if (!p.smooth.defined()) {
    p.smooth = Tensor::empty({p.n_experts, p.k}, DType::F32);
    for (int64_t i = 0; i < p.smooth.numel(); ++i) p.smooth.data<float>()[i] = 1.0f;
  }
  const Tensor s = smooth.to(DType::F32);
  for (int64_t k = 0; k < p.k; ++k) {
    const float v = s.data<float>()[k];
    MOE_CHECK(std::isfinite(v) && v > 0.0f, "smooth vector of expert {}: value {} at {} (must be finite and > 0)", e,
              v, k);
    p.smooth.data<float>()[e * p.k + k] = v;
  }
}

void set_expert_act_scale(PackedExperts& p, int64_t e, float s) {
  MOE_CHECK(p.dtype == DType::I8, "static activation scales belong to i8 (W8A8) weights, these are {}",
            dtype_name(p.dtype));
  MOE_CHECK(0 <= e && e < p.n_experts, "set_expert_act_scale: expert {} out of range [0, {})", e, p.n_experts);
  MOE_CHECK(std::isfinite(s) && s > 0.0f, "static activation scale of expert {} is {} (must be finite and > 0)", e, s);
  // 0 marks "not set": MoeLayer rejects a table with a hole.
  if (!p.act_scale.defined()) p.act_scale = Tensor::zeros({p.n_experts}, DType::F32);
  p.act_scale.data<float>()[e] = s;
}

void unpack_expert_q8(const PackedExperts& p, int64_t e, Tensor& q, Tensor& scale) {
  MOE_CHECK(p.dtype == DType::I8, "unpack_expert_q8: the packed experts are {}, not i8", dtype_name(p.dtype));
  MOE_CHECK(p.int4_group == 0, "unpack_expert_q8: the packed experts are int4 (use unpack_expert_q4)");
  MOE_CHECK(0 <= e && e < p.n_experts, "unpack_expert_q8: expert {} out of range [0, {})", e, p.n_experts);
  q = Tensor::zeros({p.n, p.k}, DType::I8);
  scale = Tensor::zeros({p.n}, DType::F32);
  const int64_t np = gg::n_panels(p.n, p.gated), pe = gg::panel_elems(p.k, DType::I8), K = p.k;
  const int64_t cols = np * gg::kPanel;
  for (int64_t P = 0; P < np; ++P) {
    const int8_t* src = static_cast<const int8_t*>(p.data.raw()) + e * p.expert_stride + P * pe;
    for (int j = 0; j < gg::kPanel; ++j) {
      const int64_t row = gg::panel_col_to_row(p, P, j);
      if (row < 0) continue;
      for (int64_t k = 0; k < K; ++k) q.data<int8_t>()[row * K + k] = src[((k / 4) * gg::kPanel + j) * 4 + (k & 3)];
      scale.data<float>()[row] = p.w_scale.data<float>()[e * cols + P * gg::kPanel + j];
    }
  }
}

}  // namespace moe
