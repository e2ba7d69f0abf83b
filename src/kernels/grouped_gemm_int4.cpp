// W4A8 grouped GEMM (kernels/grouped_gemm_int4.h): allocation, quantisation and packing,
// unpacking, the scalar reference and the portable task runner. The AVX2 runner is in
// grouped_gemm_int4_avx2.cpp; layout: grouped_gemm_int4_impl.h.
#include "kernels/grouped_gemm_int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/grouped_gemm_int4_impl.h"
#include "kernels/quant.h"

namespace moe {

using gg::kPanel;

bool valid_int4_group(int64_t g) { return g == 32 || g == 64 || g == 128; }

bool valid_coded_format(const CodedFormat& f) {
  const bool groups = f.bits == 4 ? valid_int4_group(f.group)
                                  : (f.bits == 6 || f.bits == 8) && (f.group == 16 || valid_int4_group(f.group));
  return groups && f.sb_groups >= 0 && f.sb_groups <= 64 && f.zero >= -1 && f.zero < (1 << f.bits) &&
         !(f.offsets && f.zero >= 0);
}

CodedFormat coded_format(const PackedExperts& p) {
  MOE_CHECK(p.int4_group > 0, "coded_format: the packed experts are {}, not group-coded", dtype_name(p.dtype));
  return {p.int4_group, p.code_bits, p.w_offset.defined() || p.w_sb_m.defined(), p.sb_groups, p.uniform_zero};
}

PackedExperts make_packed_experts_coded(int64_t n_experts, int64_t n, int64_t k, bool gated, const CodedFormat& f) {
  MOE_CHECK(valid_coded_format(f), "group-coded experts: {}-bit codes take groups of {} (got {}) and a uniform zero "
            "point in [0, {}) in the zero-point form only (got {})", f.bits,
            f.bits == 4 ? "32, 64 or 128" : "16, 32, 64 or 128", f.group, 1 << f.bits, f.zero);
  MOE_CHECK(n_experts >= 0 && n > 0 && k > 0, "group-coded experts: bad shape E={} n={} k={}", n_experts, n, k);
  MOE_CHECK(!gated || n % 2 == 0, "group-coded experts: gated weights need an even n (gate + up rows), got n={}", n);
  PackedExperts p;
  p.dtype = DType::I8;
  p.int4_group = f.group;
  p.code_bits = f.bits;
  p.n_experts = n_experts;
  p.n = n;
  p.k = k;
  p.gated = gated;
  const int64_t np = gg::n_panels(n, gated);
  p.expert_stride = np * gg::coded_panel_bytes(f.bits, k);
  // Zeroed: padding codes, zero points, offsets and scales read as 0 (see the layout).
  p.data = zeroed_huge_pages({n_experts * p.expert_stride}, DType::I8);
  const int64_t ng = int4_n_groups(k, f.group), cols = np * ng * kPanel;
  if (f.sb_groups > 0) {
    p.sb_groups = f.sb_groups;
    const int64_t sb_cols = np * ((ng + f.sb_groups - 1) / f.sb_groups) * kPanel;
    p.w_sb_d = Tensor::zeros({n_experts, sb_cols}, DType::F16);
    if (f.sb_groups > 1) p.w_sc = Tensor::zeros({n_experts, cols}, DType::I8);  // 1: unit factors, not stored
    if (f.offsets) {
      p.w_sb_m = Tensor::zeros({n_experts, sb_cols}, DType::F16);
      if (f.sb_groups > 1) p.w_mn = Tensor::zeros({n_experts, cols}, DType::U8);
    }
  } else {
    p.w_scale = Tensor::zeros({n_experts, cols}, DType::F32);
    if (f.offsets) p.w_offset = Tensor::zeros({n_experts, cols}, DType::F32);
  }
  if (!f.offsets && f.zero < 0) p.w_zero = Tensor::zeros({n_experts, cols}, DType::U8);
  p.uniform_zero = f.offsets ? -1 : f.zero;
  return p;
}

PackedExperts make_packed_experts_int4(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t group,
                                       bool zero_points) {
  MOE_CHECK(valid_int4_group(group), "int4 experts: group size must be 32, 64 or 128, got {}", group);
  PackedExperts p = make_packed_experts_coded(n_experts, n, k, gated, {group, 4, false});
  p.int4_zero_points = zero_points;
  return p;
}

size_t int4_bytes_per_expert(const PackedExperts& p) {
  MOE_CHECK(p.int4_group > 0, "int4_bytes_per_expert: the packed experts are not int4");
  const int64_t e = std::max<int64_t>(1, p.n_experts);
  size_t side = 0;
  for (const Tensor* t : {&p.w_scale, &p.w_zero, &p.w_offset, &p.w_sb_d, &p.w_sb_m, &p.w_sc, &p.w_mn})
    side += t->defined() ? t->nbytes() : 0;
  return p.bytes_per_expert() + side / e;
}

namespace {
// clamp(x, lo, hi) with NaN -> lo, so a NaN weight still gives a defined code.
inline float clamp_code(float x, float lo, float hi) { return !(x >= lo) ? lo : x > hi ? hi : x; }
}  // namespace

float quantize_weight_group_q4(const float* v, int64_t len, bool zero_points, uint8_t* u, uint8_t* zero) {
  if (zero_points) {
    float mn = 0.0f, mx = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      mn = std::min(mn, v[i]);
      mx = std::max(mx, v[i]);
    }
    if (!(mx > mn)) {  // all zero (or NaN): every value is the zero point
      *zero = 0;
      std::fill(u, u + len, uint8_t{0});
      return 0.0f;
    }
    const float inv = 15.0f / (mx - mn);
    const float z = clamp_code(std::nearbyint(-mn * inv), 0.0f, 15.0f);
    *zero = static_cast<uint8_t>(z);
    for (int64_t i = 0; i < len; ++i) u[i] = static_cast<uint8_t>(clamp_code(std::nearbyint(v[i] * inv) + z, 0.0f, 15.0f));
    return (mx - mn) / 15.0f;
  }
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(v[i]));
  *zero = 8;
  if (!(amax > 0.0f)) {
    std::fill(u, u + len, uint8_t{8});
    return 0.0f;
  }
  const float inv = 7.0f / amax;
  for (int64_t i = 0; i < len; ++i) u[i] = static_cast<uint8_t>(clamp_code(std::nearbyint(v[i] * inv), -7.0f, 7.0f) + 8.0f);
  return amax / 7.0f;
}

namespace gg {

namespace {

// The panel and column that hold logical row `row` of W (panel_col_to_row's inverse).
struct PanelCol {
  int64_t P;
  int j;
};
PanelCol row_to_panel_col(const PackedExperts& p, int64_t row) {
  if (p.gated) {
    const int64_t half = p.n / 2, c = row < half ? row : row - half;
    return {c / kGateCols, static_cast<int>(c % kGateCols) + (row < half ? 0 : kGateCols)};
  }
  return {row / kPanel, static_cast<int>(row % kPanel)};
}

// Writes rows [row0, row0 + rows) of expert e from their codes u [rows, k], scales and
// zero points or offsets [rows, n_groups] (the one of zero / offset the format does not
// use is null). Padding columns are never written: they keep the allocation's zeros.
void pack_coded_rows(PackedExperts& p, int64_t e, const uint8_t* u, const uint8_t* zero, const float* offset,
                     const float* scale, int64_t row0, int64_t rows) {
  const bool g8 = p.code_bits == 8, g6 = p.code_bits == 6;
  const int64_t np = n_panels(p.n, p.gated), pb = coded_panel_bytes(p.code_bits, p.k), K = p.k;
  const int64_t ng = int4_n_groups(K, p.int4_group), cols = np * ng * kPanel;
  float* ws = scale ? p.w_scale.data<float>() + e * cols : nullptr;
  uint8_t* wz = zero ? p.w_zero.data<uint8_t>() + e * cols : nullptr;
  float* wo = offset ? p.w_offset.data<float>() + e * cols : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const auto [P, j] = row_to_panel_col(p, row0 + r);
    uint8_t* dst = static_cast<uint8_t*>(p.data.raw()) + e * p.expert_stride + P * pb;
    {
      const uint8_t* ur = u + r * K;
      if (g8) {
        // A quad's 4 codes of column j are 4 consecutive bytes (g8_byte).
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) std::memcpy(dst + g8_byte(k, j), ur + k, 4);
        for (; k < K; ++k) dst[g8_byte(k, j)] = ur[k];
      } else if (g6) {
        // A quad's 4 codes of column j sit in 4 consecutive nibble bytes and 4 consecutive
        // top-bit bytes (g6_place), which 1 and 3 other columns share: a word at a time,
        // read, masked, written (one code at a time was 3/4 of this function's samples in a
        // Q4_K_M GGUF load, whose Q5_K and Q6_K tensors hold 29 % of its codes).
        const G6Place pl = g6_place(j, 0);
        const uint32_t nm = 0x0f0f0f0fu << pl.nib_shift, tm = 0x03030303u << pl.top_shift;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) {
          uint8_t* quad = dst + (k / 4) * kG6QuadBytes;
          uint32_t c, nb, tb;
          std::memcpy(&c, ur + k, 4);
          std::memcpy(&nb, quad + pl.nib, 4);
          std::memcpy(&tb, quad + pl.top, 4);
          nb = (nb & ~nm) | ((c & 0x0f0f0f0fu) << pl.nib_shift);
          tb = (tb & ~tm) | (((c >> 4) & 0x03030303u) << pl.top_shift);
          std::memcpy(quad + pl.nib, &nb, 4);
          std::memcpy(quad + pl.top, &tb, 4);
        }
        for (; k < K; ++k) g6_set(dst + (k / 4) * kG6QuadBytes, j, static_cast<int>(k & 3), ur[k]);
      } else {
        // Whole bytes: byte i of octet o holds k = 8o + i (low nibble) and 8o + 4 + i (high),
        // both of this column, so nothing else shares it (k >= K: nibble 0, the padding).
        // Whole octets a word at a time: bytes i = 0..3 of column j are consecutive
        // (i4_byte), their low nibbles codes 8o + i, their high ones 8o + 4 + i.
        int64_t o = 0;
        for (; 8 * o + 8 <= K; ++o) {
          uint32_t lo, hi;
          std::memcpy(&lo, ur + 8 * o, 4);
          std::memcpy(&hi, ur + 8 * o + 4, 4);
          const uint32_t b = (lo & 0x0f0f0f0fu) | (hi & 0x0f0f0f0fu) << 4;
          std::memcpy(dst + i4_byte(8 * o, j), &b, 4);
        }
        for (const int64_t n_oct = i4_octets(K); o < n_oct; ++o)
          for (int i = 0; i < 4; ++i) {
            const int64_t k0 = 8 * o + i, k1 = k0 + 4;
            const int lo = k0 < K ? ur[k0] & 0x0f : 0, hi = k1 < K ? ur[k1] & 0x0f : 0;
            dst[i4_byte(k0, j)] = static_cast<uint8_t>(lo | hi << 4);
          }
      }
      const int64_t gr = r * ng;  // this row's first group in the inputs
      for (int64_t G = 0; (ws || wz || wo) && G < ng; ++G) {  // none: the super-block form (pack_sb_rows)
        const int64_t at = (P * ng + G) * kPanel + j;
        if (ws) ws[at] = scale[gr + G];
        if (wz) wz[at] = zero[gr + G];
        if (wo) wo[at] = offset[gr + G];
      }
    }
  }
}

// Writes rows [row0, row0 + rows) of expert e's super-block fields: D (and M) [rows, n_sb]
// f16 bits, sc (and mn) [rows, ng].
void pack_sb_rows(PackedExperts& p, int64_t e, const uint16_t* d, const uint16_t* m, const int8_t* sc,
                  const uint8_t* mn, int64_t row0, int64_t rows) {
  const int64_t np = n_panels(p.n, p.gated), ng = int4_n_groups(p.k, p.int4_group);
  const int64_t nsb = (ng + p.sb_groups - 1) / p.sb_groups, cols = np * ng * kPanel, sb_cols = np * nsb * kPanel;
  // The destinations once (Tensor::data checks the dtype on every call).
  uint16_t* wd = p.w_sb_d.data<uint16_t>() + e * sb_cols;
  uint16_t* wm = m ? p.w_sb_m.data<uint16_t>() + e * sb_cols : nullptr;
  int8_t* wsc = sc ? p.w_sc.data<int8_t>() + e * cols : nullptr;
  uint8_t* wmn = mn ? p.w_mn.data<uint8_t>() + e * cols : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const auto [P, j] = row_to_panel_col(p, row0 + r);
    for (int64_t B = 0; B < nsb; ++B) {
      const int64_t at = (P * nsb + B) * kPanel + j;
      wd[at] = d[r * nsb + B];
      if (wm) wm[at] = m[r * nsb + B];
    }
    for (int64_t G = 0; wsc && G < ng; ++G) {
      const int64_t at = (P * ng + G) * kPanel + j;
      wsc[at] = sc[r * ng + G];
      if (wmn) wmn[at] = mn[r * ng + G];
    }
  }
}

void check_int4(const PackedExperts& p, int64_t e, const char* what) {
  MOE_CHECK(p.int4_group > 0, "{}: the packed experts are {}, not group-coded", what, dtype_name(p.dtype));
  MOE_CHECK(0 <= e && e < p.n_experts, "{}: expert {} out of range [0, {})", what, e, p.n_experts);
}

}  // namespace

void fill_job_i4(const PackedExperts& p, Job& j) {
  j.panel_stride = coded_panel_bytes(p.code_bits, p.k);
  j.i4_n_groups = int4_n_groups(p.k, p.int4_group);
  j.i4_group = p.int4_group;
  j.q_stride = n_panels(p.n, p.gated) * j.i4_n_groups * kPanel;
  j.w_scale = p.w_scale.defined() ? p.w_scale.data<float>() : nullptr;
  j.w_comp = nullptr;
  j.i4_zero = p.w_zero.defined() ? p.w_zero.data<uint8_t>() : nullptr;
  j.i4_uniform_zero = p.uniform_zero;
  j.i4_offset = p.w_offset.defined() ? p.w_offset.data<float>() : nullptr;
  j.i4_sb_groups = p.sb_groups;
  if (p.sb_groups > 0) {
    j.i4_sb_stride = p.w_sb_d.dim(1);
    j.i4_sb_d = p.w_sb_d.data<uint16_t>();
    j.i4_sb_m = p.w_sb_m.defined() ? p.w_sb_m.data<uint16_t>() : nullptr;
    j.i4_sc = p.w_sc.defined() ? p.w_sc.data<int8_t>() : nullptr;
    j.i4_mn = p.w_mn.defined() ? p.w_mn.data<uint8_t>() : nullptr;
  }
}

void pack_expert_i4(PackedExperts& p, int64_t e, const Tensor& w) {
  check_int4(p, e, "pack_expert (int4)");
  MOE_CHECK(p.code_bits == 4 && !p.w_offset.defined() && p.sb_groups == 0, "pack_expert: these experts hold "
            "{}-bit codes{} as GGUF stores them; they are packed from their codes (pack_expert_coded), not quantised "
            "from floats", p.code_bits, p.w_offset.defined() || p.sb_groups > 0 ? " with offsets or super-blocks" : "");
  Tensor wf = w.to(DType::F32);  // a copy: the smooth vector is folded in below
  float* W = wf.data<float>();
  const int64_t N = p.n, K = p.k, g = p.int4_group, ng = int4_n_groups(K, g);
  if (p.smooth.defined()) {
    const float* s = p.smooth.data<float>() + e * K;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) W[n * K + k] *= s[k];
  }
  std::vector<uint8_t> u(N * K), z(N * ng);
  std::vector<float> scale(N * ng);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t k0 = G * g, len = std::min(g, K - k0);
      scale[n * ng + G] = quantize_weight_group_q4(W + n * K + k0, len, p.int4_zero_points, u.data() + n * K + k0,
                                                   z.data() + n * ng + G);
    }
  pack_coded_rows(p, e, u.data(), z.data(), nullptr, scale.data(), 0, p.n);
}

// w = (u - z) * s or u * s - offset, as the GEMM's weights (exact for GGUF's types).
Tensor unpack_expert_i4(const PackedExperts& p, int64_t e) {
  const CodedWeight w = unpack_expert_coded(p, e);
  const int64_t K = p.k, ng = int4_n_groups(K, p.int4_group);
  const uint8_t* U = w.u.data<uint8_t>();
  const float* S = w.scale.data<float>();
  Tensor out = Tensor::empty({p.n, K}, DType::F32);
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = n * ng + k / p.int4_group;
      out.data<float>()[n * K + k] =
          w.offset.defined() ? static_cast<float>(U[n * K + k]) * S[g] - w.offset.data<float>()[g]
                             : static_cast<float>(int(U[n * K + k]) - int(w.zero.data<uint8_t>()[g])) * S[g];
    }
  return out;
}

void reference_i4(const GroupedGemmParams& p) {
  const PackedExperts& w = *p.w;
  const int64_t K = w.k, N = w.n, n_out = w.n_out(), g = w.int4_group, ng = int4_n_groups(K, g);
  std::vector<float> acc(N);
  for (int64_t e = 0; e < w.n_experts; ++e) {
    const int64_t r0 = p.offsets[e], r1 = p.offsets[e + 1];
    if (r0 == r1) continue;
    const CodedWeight cw = unpack_expert_coded(w, e);
    const uint8_t* U = cw.u.data<uint8_t>();
    const uint8_t* Z = cw.zero.defined() ? cw.zero.data<uint8_t>() : nullptr;
    const float* O = cw.offset.defined() ? cw.offset.data<float>() : nullptr;
    const float* S = cw.scale.data<float>();
    for (int64_t r = r0; r < r1; ++r) {
      const char* arow = static_cast<const char*>(p.a) + r * p.lda;
      const auto* qa = reinterpret_cast<const int8_t*>(arow);
      const float as = q8_row_scale(arow, K);
      for (int64_t n = 0; n < N; ++n) {
        float f = 0.0f;
        for (int64_t G = 0; G < ng; ++G) {
          int64_t dot = 0, sa = 0;
          for (int64_t k = G * g; k < std::min(K, (G + 1) * g); ++k) {
            dot += int64_t(qa[k]) * int64_t(U[n * K + k]);
            sa += qa[k];
          }
          f = i4_flush(f, static_cast<int32_t>(dot), static_cast<int32_t>(sa), S[n * ng + G], Z, O, n * ng + G);
        }
        acc[n] = f * as;
      }
      if (w.gated)
        for (int64_t c = 0; c < n_out; ++c) acc[c] = act_gate(p.act, acc[c]) * acc[n_out + c];
      convert_from_f32(acc.data(), static_cast<char*>(p.c) + r * p.ldc * dtype_size(p.c_dtype), p.c_dtype, n_out);
    }
  }
}

// Portable: per group, exact int32 dot products of the activations with the unsigned
// codes and the group sums of the activations, then i4_flush. kBits: 4 (nibbles in
// octets), 6 (nibbles and top bits in quads) or 8 (bytes in quads).
template <int kBits>
void run_task_portable_coded(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel, K = j.k, ng = j.i4_n_groups, g = j.i4_group;
  std::vector<int32_t> sa(kI4MaxRows * ng);
  const I4TaskSides sides(j, t);
  for (int64_t rb = 0; rb < rows; rb += kI4MaxRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kI4MaxRows, rows - rb));
    const int8_t* a[kI4MaxRows];
    for (int r = 0; r < mr; ++r) {
      a[r] = reinterpret_cast<const int8_t*>(j.a + (r0 + rb + r) * j.lda_bytes);
      i4_group_sums(a[r], K, g, ng, sa.data() + r * ng);
    }
    for (int64_t P = t.p0; P < t.p1; ++P) {
      const auto* panel = reinterpret_cast<const uint8_t*>(j.w + t.expert * j.expert_stride + P * j.panel_stride);
      const float *ws, *wo;
      const uint8_t* wz;
      sides.panel(P, &ws, &wz, &wo);
      float acc[kI4MaxRows][kPanel] = {};
      for (int64_t G = 0; G < ng; ++G) {
        int32_t dot[kI4MaxRows][kPanel] = {};
        // Blocks of the group: octets of 8 k (4-bit) or quads of 4 k (8-bit).
        constexpr int64_t kStep = kBits == 4 ? 8 : 4;
        const int64_t b1 = std::min((K + kStep - 1) / kStep, (G + 1) * g / kStep);
        for (int64_t o = G * g / kStep; o < b1; ++o) {
          const uint8_t* b = panel + o * (kBits == 6 ? kG6QuadBytes : kI4OctetBytes);
          for (int r = 0; r < mr; ++r) {
            const int8_t* ar = a[r] + kStep * o;  // bytes past K meet zero codes
            for (int c = 0; c < kPanel; ++c) {
              int32_t s = 0;
              for (int i = 0; i < 4; ++i)
                s += kBits == 4   ? ar[i] * (b[4 * c + i] & 0x0f) + ar[4 + i] * (b[4 * c + i] >> 4)
                     : kBits == 6 ? ar[i] * g6_code(b, c, i)
                                  : ar[i] * b[4 * c + i];
              dot[r][c] += s;
            }
          }
        }
        for (int r = 0; r < mr; ++r)
          for (int c = 0; c < kPanel; ++c)
            acc[r][c] = i4_flush(acc[r][c], dot[r][c], sa[r * ng + G], ws[G * kPanel + c], wz, wo, G * kPanel + c);
      }
      for (int r = 0; r < mr; ++r) {
        float as;
        std::memcpy(&as, reinterpret_cast<const char*>(a[r]) + j.a_scale_off, 4);
        i4_epilogue_row(j, acc[r], as, j.c + (r0 + rb + r) * j.ldc_bytes, P * per, valid_cols(j, P));
      }
    }
  }
}

void run_task_portable_i4(const Job& j, const Task& t) { run_task_portable_coded<4>(j, t); }
void run_task_portable_g8(const Job& j, const Task& t) { run_task_portable_coded<8>(j, t); }
void run_task_portable_g6(const Job& j, const Task& t) { run_task_portable_coded<6>(j, t); }

}  // namespace gg

void pack_expert_q4(PackedExperts& p, int64_t e, const Tensor& u, const Tensor& zero, const Tensor& scale) {
  gg::check_int4(p, e, "pack_expert_q4");
  MOE_CHECK(p.code_bits == 4 && p.w_zero.defined() && p.sb_groups == 0, "pack_expert_q4: the packed experts hold "
            "{}-bit codes{} (use pack_expert_coded)", p.code_bits, p.w_offset.defined() ? " with offsets" : "");
  const int64_t ng = int4_n_groups(p.k, p.int4_group);
  MOE_CHECK(u.dtype() == DType::U8 && u.ndim() == 2 && u.dim(0) == p.n && u.dim(1) == p.k,
            "pack_expert_q4: expected u8 codes [{}, {}], got {}", p.n, p.k, u.describe());
  MOE_CHECK(zero.dtype() == DType::U8 && zero.ndim() == 2 && zero.dim(0) == p.n && zero.dim(1) == ng,
            "pack_expert_q4: expected u8 zero points [{}, {}] (one per {} k), got {}", p.n, ng, p.int4_group,
            zero.describe());
  MOE_CHECK(scale.ndim() == 2 && scale.dim(0) == p.n && scale.dim(1) == ng,
            "pack_expert_q4: expected scales [{}, {}] (one per {} k), got {}", p.n, ng, p.int4_group,
            scale.describe());
  // Contiguous copies only where needed (a view of a checkpoint may be strided; the
  // GGUF loader's slices are not); the checks are one pass with the counts hoisted.
  auto dense = [](const Tensor& t) { return t.is_contiguous() ? t : t.clone(); };
  const Tensor uc = dense(u), zc = dense(zero), sc = scale.dtype() == DType::F32 ? dense(scale) : scale.to(DType::F32);
  const uint8_t* up = uc.data<uint8_t>();
  const uint8_t* zp = zc.data<uint8_t>();
  const float* sp = sc.data<float>();
  for (int64_t i = 0, n = uc.numel(); i < n; ++i)
    MOE_CHECK(up[i] < 16, "pack_expert_q4: code {} of expert {} is {} (must be in [0, 15])", i, e, int(up[i]));
  for (int64_t i = 0, n = zc.numel(); i < n; ++i)
    MOE_CHECK(zp[i] < 16, "pack_expert_q4: zero point {} of expert {} is {} (must be in [0, 15])", i, e, int(zp[i]));
  for (int64_t i = 0, n = sc.numel(); i < n; ++i)
    MOE_CHECK(std::isfinite(sp[i]) && sp[i] >= 0.0f, "pack_expert_q4: scale {} of expert {} is {} (must be finite and "
              ">= 0)", i, e, sp[i]);
  gg::pack_coded_rows(p, e, up, zp, nullptr, sp, 0, p.n);
}

void pack_gated_expert_q4(PackedExperts& w13, PackedExperts& w2, int64_t e, const Q4Weight& gate, const Q4Weight& up,
                          const Q4Weight& down) {
  auto stack = [](const Tensor& a, const Tensor& b) {
    Tensor t = Tensor::empty({a.dim(0) + b.dim(0), a.dim(1)}, a.dtype());
    std::memcpy(t.raw(), a.raw(), a.nbytes());
    std::memcpy(static_cast<char*>(t.raw()) + a.nbytes(), b.raw(), b.nbytes());
    return t;
  };
  pack_expert_q4(w13, e, stack(gate.u, up.u), stack(gate.zero, up.zero), stack(gate.scale, up.scale));
  pack_expert_q4(w2, e, down.u, down.zero, down.scale);
}

void unpack_expert_q4(const PackedExperts& p, int64_t e, Tensor& u, Tensor& zero, Tensor& scale) {
  MOE_CHECK(p.int4_group <= 0 || !coded_format(p).offsets, "unpack_expert_q4: the packed experts have offsets, not "
            "zero points (use unpack_expert_coded)");
  CodedWeight w = unpack_expert_coded(p, e);
  u = std::move(w.u);
  zero = std::move(w.zero);
  scale = std::move(w.scale);
}

void pack_expert_coded(PackedExperts& p, int64_t e, const CodedWeight& w, int64_t row0) {
  gg::check_int4(p, e, "pack_expert_coded");
  const int64_t rows = w.u.defined() && w.u.ndim() == 2 ? w.u.dim(0) : p.n;
  MOE_CHECK(row0 >= 0 && rows >= 1 && row0 + rows <= p.n,
            "pack_expert_coded: rows [{}, {}) of expert {} are outside its {} rows", row0, row0 + rows, e, p.n);
  const int64_t ng = int4_n_groups(p.k, p.int4_group);
  const bool sb = p.sb_groups > 0, off = p.w_offset.defined() || p.w_sb_m.defined();
  const int64_t nsb = sb ? (ng + p.sb_groups - 1) / p.sb_groups : 0;
  auto check = [&](const Tensor& t, DType dt, int64_t cols, const char* what) {
    MOE_CHECK(t.defined() && t.dtype() == dt && t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols,
              "pack_expert_coded: expected {} {} [{}, {}], got {}", what, dtype_name(dt), rows, cols,
              t.defined() ? t.describe() : std::string("none"));
  };
  auto dense = [](const Tensor& t) { return !t.defined() || t.is_contiguous() ? t : t.clone(); };
  check(w.u, DType::U8, p.k, "codes");
  const Tensor uc = dense(w.u);
  const int limit = 1 << p.code_bits;
  const uint8_t* up = uc.data<uint8_t>();
  // The checks scan every code: a branch-free max first (it vectorises), the offending
  // index looked for only when there is one.
  auto max_of = [](const uint8_t* v, int64_t n) {
    uint8_t m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, v[i]);
    return m;
  };
  if (max_of(up, uc.numel()) >= limit)
    for (int64_t i = 0, n = uc.numel(); i < n; ++i)
      MOE_CHECK(up[i] < limit, "pack_expert_coded: code {} of expert {} is {} (must be in [0, {}))", row0 * p.k + i, e,
                int(up[i]), limit);
  Tensor zc;
  if (!off) {
    check(w.zero, DType::U8, ng, "zero points");
    zc = dense(w.zero);
    const uint8_t* zp = zc.data<uint8_t>();
    const int64_t nz = zc.numel();
    uint8_t zmin = 255, zmax = 0;
    for (int64_t i = 0; i < nz; ++i) {
      zmin = std::min(zmin, zp[i]);
      zmax = std::max(zmax, zp[i]);
    }
    const bool uniform_ok = p.uniform_zero < 0 || (zmin == p.uniform_zero && zmax == p.uniform_zero);
    const bool fine = nz == 0 || (zmax < limit && uniform_ok);
    for (int64_t i = 0; !fine && i < nz; ++i) {
      MOE_CHECK(zp[i] < limit, "pack_expert_coded: zero point {} of expert {} is {} (must be in [0, {}))",
                row0 * ng + i, e,
                int(zp[i]), limit);
      MOE_CHECK(p.uniform_zero < 0 || zp[i] == p.uniform_zero,
                "pack_expert_coded: zero point {} of expert {} is {}, these experts hold {} for every group",
                row0 * ng + i, e,
                int(zp[i]), p.uniform_zero);
    }
  }
  const uint8_t* zp = off || p.uniform_zero >= 0 ? nullptr : zc.data<uint8_t>();
  if (sb) {
    const bool factors = p.sb_groups > 1;  // one group per super-block: unit factors, none given
    check(w.sb_d, DType::F16, nsb, "super-block scales D");
    if (factors) check(w.sc, DType::I8, ng, "group scales sc");
    if (off) {
      check(w.sb_m, DType::F16, nsb, "super-block mins M");
      if (factors) check(w.mn, DType::U8, ng, "group mins mn");
    }
    const Tensor d = dense(w.sb_d), m = dense(w.sb_m), sc = dense(w.sc), mn = dense(w.mn);
    for (const Tensor* t : {&d, &m}) {
      if (!t->defined()) continue;
      const uint16_t* h = t->data<uint16_t>();
      for (int64_t i = 0, n = t->numel(); i < n; ++i)  // f16 exponent all ones: inf or NaN
        MOE_CHECK((h[i] & 0x7c00) != 0x7c00, "pack_expert_coded: super-block {} {} of expert {} is {} (must be finite)",
                  t == &d ? "scale" : "min", row0 * nsb + i, e, f16_to_f32(h[i]));
    }
    gg::pack_coded_rows(p, e, up, zp, nullptr, nullptr, row0, rows);
    gg::pack_sb_rows(p, e, d.data<uint16_t>(), off ? m.data<uint16_t>() : nullptr,
                     factors ? sc.data<int8_t>() : nullptr, factors && off ? mn.data<uint8_t>() : nullptr, row0, rows);
    return;
  }
  check(w.scale, DType::F32, ng, "scales");
  const Tensor sc = dense(w.scale);
  const float* sp = sc.data<float>();
  for (int64_t i = 0, n = sc.numel(); i < n; ++i)
    MOE_CHECK(std::isfinite(sp[i]), "pack_expert_coded: scale {} of expert {} is {} (must be finite)", row0 * ng + i, e,
              sp[i]);
  if (off) {
    check(w.offset, DType::F32, ng, "offsets");
    const Tensor oc = dense(w.offset);
    const float* op = oc.data<float>();
    for (int64_t i = 0, n = oc.numel(); i < n; ++i)
      MOE_CHECK(std::isfinite(op[i]), "pack_expert_coded: offset {} of expert {} is {} (must be finite)",
                row0 * ng + i, e, op[i]);
    gg::pack_coded_rows(p, e, up, nullptr, op, sp, row0, rows);
  } else {
    gg::pack_coded_rows(p, e, up, zp, nullptr, sp, row0, rows);
  }
}

CodedWeight unpack_expert_coded(const PackedExperts& p, int64_t e) {
  gg::check_int4(p, e, "unpack_expert_coded");
  const bool g8 = p.code_bits == 8, g6 = p.code_bits == 6;
  const int64_t np = gg::n_panels(p.n, p.gated), pb = gg::coded_panel_bytes(p.code_bits, p.k), K = p.k;
  const int64_t ng = int4_n_groups(K, p.int4_group), cols = np * ng * kPanel;
  const bool sb = p.sb_groups > 0, off = p.w_offset.defined() || p.w_sb_m.defined();
  const int64_t nsb = sb ? (ng + p.sb_groups - 1) / p.sb_groups : 0, sb_cols = np * nsb * kPanel;
  CodedWeight w;
  w.u = Tensor::zeros({p.n, K}, DType::U8);
  w.scale = Tensor::zeros({p.n, ng}, DType::F32);
  if (off) {
    w.offset = Tensor::zeros({p.n, ng}, DType::F32);
  } else {
    w.zero = Tensor::zeros({p.n, ng}, DType::U8);
  }
  const bool factors = p.sb_groups > 1;
  if (sb) {
    w.sb_d = Tensor::zeros({p.n, nsb}, DType::F16);
    if (factors) w.sc = Tensor::zeros({p.n, ng}, DType::I8);
    if (off) {
      w.sb_m = Tensor::zeros({p.n, nsb}, DType::F16);
      if (factors) w.mn = Tensor::zeros({p.n, ng}, DType::U8);
    }
  }
  for (int64_t P = 0; P < np; ++P) {
    const uint8_t* src = static_cast<const uint8_t*>(p.data.raw()) + e * p.expert_stride + P * pb;
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = gg::panel_col_to_row(p, P, j);
      if (row < 0) continue;
      uint8_t* ur = w.u.data<uint8_t>() + row * K;
      for (int64_t k = 0; k < K; ++k)
        ur[k] = g8   ? src[gg::g8_byte(k, j)]
                : g6 ? static_cast<uint8_t>(gg::g6_code(src + (k / 4) * gg::kG6QuadBytes, j, static_cast<int>(k & 3)))
                     : static_cast<uint8_t>((src[gg::i4_byte(k, j)] >> gg::i4_shift(k)) & 0x0f);
      for (int64_t G = 0; G < ng; ++G) {
        const int64_t at = e * cols + (P * ng + G) * kPanel + j, r = row * ng + G;
        if (w.zero.defined())
          w.zero.data<uint8_t>()[r] = p.uniform_zero >= 0 ? static_cast<uint8_t>(p.uniform_zero)
                                                          : p.w_zero.data<uint8_t>()[at];
        if (!sb) {
          w.scale.data<float>()[r] = p.w_scale.data<float>()[at];
          if (off) w.offset.data<float>()[r] = p.w_offset.data<float>()[at];
          continue;
        }
        // The effective values, as gg::i4_expand_panel forms them: D * sc, M * mn.
        const int64_t sat = e * sb_cols + (P * nsb + G / p.sb_groups) * kPanel + j, sr = row * nsb + G / p.sb_groups;
        const uint16_t d = p.w_sb_d.data<uint16_t>()[sat];
        w.sb_d.data<uint16_t>()[sr] = d;
        if (factors) {
          const int8_t sc = p.w_sc.data<int8_t>()[at];
          w.sc.data<int8_t>()[r] = sc;
          w.scale.data<float>()[r] = f16_to_f32(d) * static_cast<float>(sc);
        } else {
          w.scale.data<float>()[r] = f16_to_f32(d);
        }
        if (off) {
          const uint16_t m = p.w_sb_m.data<uint16_t>()[sat];
          w.sb_m.data<uint16_t>()[sr] = m;
          if (factors) {
            const uint8_t mn = p.w_mn.data<uint8_t>()[at];
            w.mn.data<uint8_t>()[r] = mn;
            w.offset.data<float>()[r] = f16_to_f32(m) * static_cast<float>(mn);
          } else {
            w.offset.data<float>()[r] = f16_to_f32(m);
          }
        }
      }
    }
  }
  return w;
}

}  // namespace moe
