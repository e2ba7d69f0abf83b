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

PackedExperts make_packed_experts_int4(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t group,
                                       bool zero_points) {
  MOE_CHECK(valid_int4_group(group), "int4 experts: group size must be 32, 64 or 128, got {}", group);
  MOE_CHECK(n_experts >= 0 && n > 0 && k > 0, "int4 experts: bad shape E={} n={} k={}", n_experts, n, k);
  MOE_CHECK(!gated || n % 2 == 0, "int4 experts: gated weights need an even n (gate + up rows), got n={}", n);
  PackedExperts p;
  p.dtype = DType::I8;
  p.int4_group = group;
  p.int4_zero_points = zero_points;
  p.n_experts = n_experts;
  p.n = n;
  p.k = k;
  p.gated = gated;
  const int64_t np = gg::n_panels(n, gated);
  p.expert_stride = np * gg::i4_panel_bytes(k);
  // Zeroed: padding nibbles, zero points and scales read as 0 (see the layout).
  p.data = zeroed_huge_pages({n_experts * p.expert_stride}, DType::I8);
  const int64_t cols = np * int4_n_groups(k, group) * kPanel;
  p.w_scale = Tensor::zeros({n_experts, cols}, DType::F32);
  p.w_zero = Tensor::zeros({n_experts, cols}, DType::U8);
  return p;
}

size_t int4_bytes_per_expert(const PackedExperts& p) {
  MOE_CHECK(p.int4_group > 0, "int4_bytes_per_expert: the packed experts are not int4");
  const int64_t e = std::max<int64_t>(1, p.n_experts);
  return p.bytes_per_expert() + (p.w_scale.nbytes() + p.w_zero.nbytes()) / e;
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

// Writes expert e from codes u [n, k], zero points and scales [n, n_groups].
void pack_q4_rows(PackedExperts& p, int64_t e, const uint8_t* u, const uint8_t* zero, const float* scale) {
  const int64_t np = n_panels(p.n, p.gated), pb = i4_panel_bytes(p.k), K = p.k;
  const int64_t ng = int4_n_groups(K, p.int4_group), cols = np * ng * kPanel;
  float* ws = p.w_scale.data<float>() + e * cols;
  uint8_t* wz = p.w_zero.data<uint8_t>() + e * cols;
  for (int64_t P = 0; P < np; ++P) {
    uint8_t* dst = static_cast<uint8_t*>(p.data.raw()) + e * p.expert_stride + P * pb;
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = panel_col_to_row(p, P, j);
      if (row < 0) continue;
      // Whole bytes: byte i of octet o holds k = 8o + i (low nibble) and 8o + 4 + i (high),
      // both of this column, so nothing else shares it (k >= K: nibble 0, the padding).
      const uint8_t* ur = u + row * K;
      for (int64_t o = 0, n_oct = i4_octets(K); o < n_oct; ++o)
        for (int i = 0; i < 4; ++i) {
          const int64_t k0 = 8 * o + i, k1 = k0 + 4;
          const int lo = k0 < K ? ur[k0] & 0x0f : 0, hi = k1 < K ? ur[k1] & 0x0f : 0;
          dst[i4_byte(k0, j)] = static_cast<uint8_t>(lo | hi << 4);
        }
      for (int64_t G = 0; G < ng; ++G) {
        ws[(P * ng + G) * kPanel + j] = scale[row * ng + G];
        wz[(P * ng + G) * kPanel + j] = zero[row * ng + G];
      }
    }
  }
}

void check_int4(const PackedExperts& p, int64_t e, const char* what) {
  MOE_CHECK(p.int4_group > 0, "{}: the packed experts are {}, not int4", what, dtype_name(p.dtype));
  MOE_CHECK(0 <= e && e < p.n_experts, "{}: expert {} out of range [0, {})", what, e, p.n_experts);
}

}  // namespace

void fill_job_i4(const PackedExperts& p, Job& j) {
  j.panel_stride = i4_panel_bytes(p.k);
  j.i4_n_groups = int4_n_groups(p.k, p.int4_group);
  j.i4_group_oct = p.int4_group / 8;
  j.q_stride = n_panels(p.n, p.gated) * j.i4_n_groups * kPanel;
  j.w_scale = p.w_scale.data<float>();
  j.w_comp = nullptr;
  j.i4_zero = p.w_zero.data<uint8_t>();
}

void pack_expert_i4(PackedExperts& p, int64_t e, const Tensor& w) {
  check_int4(p, e, "pack_expert (int4)");
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
  pack_q4_rows(p, e, u.data(), z.data(), scale.data());
}

Tensor unpack_expert_i4(const PackedExperts& p, int64_t e) {
  Tensor u, z, s;
  unpack_expert_q4(p, e, u, z, s);
  const int64_t K = p.k, ng = int4_n_groups(K, p.int4_group);
  Tensor out = Tensor::empty({p.n, K}, DType::F32);
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t G = k / p.int4_group;
      out.data<float>()[n * K + k] =
          static_cast<float>(int(u.data<uint8_t>()[n * K + k]) - int(z.data<uint8_t>()[n * ng + G])) *
          s.data<float>()[n * ng + G];
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
    Tensor u, z, s;
    unpack_expert_q4(w, e, u, z, s);
    const uint8_t* U = u.data<uint8_t>();
    const uint8_t* Z = z.data<uint8_t>();
    const float* S = s.data<float>();
    for (int64_t r = r0; r < r1; ++r) {
      const char* arow = static_cast<const char*>(p.a) + r * p.lda;
      const auto* qa = reinterpret_cast<const int8_t*>(arow);
      const float as = q8_row_scale(arow, K);
      for (int64_t n = 0; n < N; ++n) {
        float f = 0.0f;
        for (int64_t G = 0; G < ng; ++G) {
          int64_t isum = 0;
          for (int64_t k = G * g; k < std::min(K, (G + 1) * g); ++k)
            isum += int64_t(qa[k]) * (int64_t(U[n * K + k]) - int64_t(Z[n * ng + G]));
          const float prod = static_cast<float>(static_cast<int32_t>(isum)) * S[n * ng + G];
          f = f + prod;
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
// codes, minus z * (sum of the group's activations): the integer sum q_a * (u - z).
void run_task_portable_i4(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel, K = j.k, ng = j.i4_n_groups, n_oct = i4_octets(K);
  std::vector<int32_t> sa(kI4MaxRows * ng);
  for (int64_t rb = 0; rb < rows; rb += kI4MaxRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kI4MaxRows, rows - rb));
    const int8_t* a[kI4MaxRows];
    for (int r = 0; r < mr; ++r) {
      a[r] = reinterpret_cast<const int8_t*>(j.a + (r0 + rb + r) * j.lda_bytes);
      i4_group_sums(a[r], K, j.i4_group_oct * 8, ng, sa.data() + r * ng);
    }
    for (int64_t P = t.p0; P < t.p1; ++P) {
      const auto* panel = reinterpret_cast<const uint8_t*>(j.w + t.expert * j.expert_stride + P * j.panel_stride);
      const float* ws = j.w_scale + t.expert * j.q_stride + P * ng * kPanel;
      const uint8_t* wz = j.i4_zero + t.expert * j.q_stride + P * ng * kPanel;
      float acc[kI4MaxRows][kPanel] = {};
      for (int64_t G = 0; G < ng; ++G) {
        int32_t dot[kI4MaxRows][kPanel] = {};
        const int64_t o1 = std::min(n_oct, (G + 1) * j.i4_group_oct);
        for (int64_t o = G * j.i4_group_oct; o < o1; ++o) {
          const uint8_t* b = panel + o * kI4OctetBytes;
          for (int r = 0; r < mr; ++r) {
            const int8_t* ar = a[r] + 8 * o;  // bytes past K meet zero nibbles
            for (int c = 0; c < kPanel; ++c) {
              int32_t s = 0;
              for (int i = 0; i < 4; ++i) s += ar[i] * (b[4 * c + i] & 0x0f) + ar[4 + i] * (b[4 * c + i] >> 4);
              dot[r][c] += s;
            }
          }
        }
        for (int r = 0; r < mr; ++r)
          for (int c = 0; c < kPanel; ++c) {
            const int32_t isum = dot[r][c] - int32_t(wz[G * kPanel + c]) * sa[r * ng + G];
            const float prod = static_cast<float>(isum) * ws[G * kPanel + c];
            acc[r][c] = acc[r][c] + prod;
          }
      }
      for (int r = 0; r < mr; ++r) {
        float as;
        std::memcpy(&as, reinterpret_cast<const char*>(a[r]) + j.a_scale_off, 4);
        i4_epilogue_row(j, acc[r], as, j.c + (r0 + rb + r) * j.ldc_bytes, P * per, valid_cols(j, P));
      }
    }
  }
}

}  // namespace gg

void pack_expert_q4(PackedExperts& p, int64_t e, const Tensor& u, const Tensor& zero, const Tensor& scale) {
  gg::check_int4(p, e, "pack_expert_q4");
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
  gg::pack_q4_rows(p, e, up, zp, sp);
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
  gg::check_int4(p, e, "unpack_expert_q4");
  const int64_t np = gg::n_panels(p.n, p.gated), pb = gg::i4_panel_bytes(p.k), K = p.k;
  const int64_t ng = int4_n_groups(K, p.int4_group), cols = np * ng * kPanel;
  u = Tensor::zeros({p.n, K}, DType::U8);
  zero = Tensor::zeros({p.n, ng}, DType::U8);
  scale = Tensor::zeros({p.n, ng}, DType::F32);
  for (int64_t P = 0; P < np; ++P) {
    const uint8_t* src = static_cast<const uint8_t*>(p.data.raw()) + e * p.expert_stride + P * pb;
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = gg::panel_col_to_row(p, P, j);
      if (row < 0) continue;
      for (int64_t k = 0; k < K; ++k)
        u.data<uint8_t>()[row * K + k] = static_cast<uint8_t>((src[gg::i4_byte(k, j)] >> gg::i4_shift(k)) & 0x0f);
      for (int64_t G = 0; G < ng; ++G) {
        scale.data<float>()[row * ng + G] = p.w_scale.data<float>()[e * cols + (P * ng + G) * kPanel + j];
        zero.data<uint8_t>()[row * ng + G] = p.w_zero.data<uint8_t>()[e * cols + (P * ng + G) * kPanel + j];
      }
    }
  }
}

}  // namespace moe
