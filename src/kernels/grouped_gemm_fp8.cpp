// FP8 E4M3 weight-only experts (DeepSeek-V3 block-scaled checkpoints) in the grouped GEMM:
// packing, unpacking, the portable panel dequantiser and the task runner.
//
// Why dequantise per panel instead of at load: the weights stay 1 byte per value in
// memory (half of bf16: a DeepSeek-V3 rank holds twice the experts), decode streams half
// the bytes from DRAM, and prefill still runs the bf16 microkernel at full speed because
// a task dequantises its panel once into a per-thread buffer (ceil(K/2) * 256 bytes:
// 256 KiB at K = 2048, so it stays in Zen4's 1 MiB L2) and reuses it for all its rows.
// Decode (<= 4 rows) converts the codes in registers and feeds them straight to the dot
// products (run_task_f8_avx512bf16 in grouped_gemm_avx512.cpp): no panel store/reload.
// The dequantised values are exactly dequantize_fp8_blocks(..., BF16) (f32 product of the
// e4m3 value and its block scale, rounded to nearest even), so the layer equals the one
// with weights dequantised at load, bit for bit.
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_impl.h"
#include "kernels/quant.h"

namespace moe {

using gg::kPanel;

namespace {

// Scale of packed column j (0..63) of panel P for k block kb, written for both k of a pair.
float* f8_scale_slot(PackedExperts& p, int64_t e, int64_t P, int64_t kb) {
  const int64_t n_kb = p.k / p.block_k;
  return p.w_scale.data<float>() + e * gg::n_panels(p.n, p.gated) * n_kb * 2 * kPanel + (P * n_kb + kb) * 2 * kPanel;
}

const float* f8_lut() {
  static const auto lut = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return lut.data();
}

// The kernel's AVX512-BF16 conversion flushes f32 results below 2^-126 to zero where the
// scalar RNE keeps a bf16 subnormal; the smallest nonzero e4m3 magnitude is 2^-9 and the
// largest 448 < 2^9, so scales in [2^-117, 2^100] keep every product normal and finite.
constexpr float kMinScale = 0x1p-117f, kMaxScale = 0x1p100f;

}  // namespace

PackedExperts make_packed_experts_fp8(int64_t n_experts, int64_t n, int64_t k, bool gated, int64_t block_k) {
  MOE_CHECK(n_experts >= 0 && n > 0 && k > 0, "packed fp8 experts: bad shape E={} n={} k={}", n_experts, n, k);
  MOE_CHECK(!gated || n % 2 == 0, "packed fp8 experts: gated weights need an even n (gate + up rows), got n={}", n);
  MOE_CHECK(block_k > 0 && block_k % 2 == 0 && k % block_k == 0,
            "packed fp8 experts: the scale block width {} must be even and divide k = {} (a VNNI k pair must share "
            "one scale)",
            block_k, k);
  PackedExperts p;
  p.dtype = DType::F8E4M3;
  p.n_experts = n_experts;
  p.n = n;
  p.k = k;
  p.gated = gated;
  p.block_k = block_k;
  const int64_t np = gg::n_panels(n, gated);
  p.expert_stride = np * gg::panel_elems(k, p.dtype);
  p.data = Tensor::empty({n_experts * p.expert_stride}, DType::F8E4M3);
  advise_huge_pages(p.data.raw(), p.data.nbytes());
  std::memset(p.data.raw(), 0, p.data.nbytes());  // padding columns read as +0
  p.w_scale = Tensor::zeros({n_experts, np * (k / block_k) * 2 * kPanel}, DType::F32);
  return p;
}

void pack_expert_fp8(PackedExperts& p, int64_t e, const Tensor& w, const Tensor& scale_inv, int64_t block_n) {
  MOE_CHECK(p.dtype == DType::F8E4M3, "pack_expert_fp8: packed experts are {}, not f8e4m3", dtype_name(p.dtype));
  MOE_CHECK(0 <= e && e < p.n_experts, "pack_expert_fp8: expert {} out of range [0, {})", e, p.n_experts);
  MOE_CHECK(w.dtype() == DType::F8E4M3 && w.ndim() == 2 && w.dim(0) == p.n && w.dim(1) == p.k,
            "pack_expert_fp8: expected an f8e4m3 weight [{}, {}], got {}", p.n, p.k, w.describe());
  MOE_CHECK(block_n > 0 && p.n % block_n == 0 && (!p.gated || (p.n / 2) % block_n == 0),
            "fp8 weight {}: the block height {} does not divide it (gated: each of gate and up, {} rows)",
            w.describe(), block_n, p.n / 2);
  const int64_t n_kb = p.k / p.block_k, sn = p.n / block_n;
  MOE_CHECK(scale_inv.ndim() == 2 && scale_inv.dim(0) == sn && scale_inv.dim(1) == n_kb,
            "fp8 weight {}: weight_scale_inv has shape {}, expected [{}, {}] (one scale per [{}, {}] block)",
            w.describe(), shape_str(scale_inv.shape()), sn, n_kb, block_n, p.block_k);
  const Tensor s = scale_inv.to(DType::F32);
  const float* sp = s.data<float>();
  for (int64_t i = 0; i < sn * n_kb; ++i) {
    const float a = std::fabs(sp[i]);
    MOE_CHECK(a == 0.0f || (a >= kMinScale && a <= kMaxScale),
              "fp8 weight {}: block scale {} at block [{}, {}] is outside [2^-117, 2^100] (not finite, or the "
              "dequantised values would leave bf16's normal range)",
              w.describe(), sp[i], i / n_kb, i % n_kb);
  }
  const Tensor wc = w.is_contiguous() ? w : w.clone();
  const auto* src = static_cast<const uint8_t*>(wc.raw());
  auto* dst = static_cast<uint8_t*>(p.data.raw()) + e * p.expert_stride;
  const int64_t np = gg::n_panels(p.n, p.gated), pe = gg::panel_elems(p.k, p.dtype), K = p.k;
  for (int64_t P = 0; P < np; ++P) {
    for (int j = 0; j < kPanel; ++j) {
      const int64_t row = gg::panel_col_to_row(p, P, j);
      if (row < 0) continue;
      const uint8_t* wr = src + row * K;
      uint8_t* d = dst + P * pe;
      for (int64_t k = 0; k < K; ++k) {
        MOE_CHECK((wr[k] & 0x7f) != 0x7f, "fp8 weight {}: NaN code 0x{:02x} at [{}, {}]", w.describe(), wr[k], row, k);
        d[((k / 2) * kPanel + j) * 2 + (k & 1)] = wr[k];
      }
      for (int64_t kb = 0; kb < n_kb; ++kb) {
        float* sc = f8_scale_slot(p, e, P, kb);
        sc[2 * j] = sc[2 * j + 1] = sp[(row / block_n) * n_kb + kb];
      }
    }
  }
}

namespace gg {

namespace {

void dequant_panel_portable(const Job& j, int64_t e, int64_t P, uint16_t* dst) {
  const float* lut = f8_lut();
  const auto* src = reinterpret_cast<const uint8_t*>(j.w + e * j.expert_stride + P * j.panel_stride);
  const float* sc = j.f8_scale + e * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel;
  const int64_t S = (j.k + 1) / 2;
  for (int64_t pp = 0; pp < S; ++pp) {
    const float* s = sc + (pp / j.f8_kb_pairs) * 2 * kPanel;
    for (int i = 0; i < 2 * kPanel; ++i) dst[pp * 2 * kPanel + i] = f32_to_bf16(lut[src[pp * 2 * kPanel + i]] * s[i]);
  }
}

// The per-thread bf16 panel buffer, grown to the largest panel seen (64-byte aligned:
// the bf16 kernels use aligned loads).
uint16_t* panel_buffer(int64_t bytes) {
  struct Free {
    void operator()(void* q) const { std::free(q); }
  };
  thread_local std::unique_ptr<void, Free> buf;
  thread_local int64_t cap = 0;
  if (bytes > cap) {
    const int64_t b = (bytes + 4095) & ~int64_t{4095};
    buf.reset(std::aligned_alloc(4096, static_cast<size_t>(b)));
    MOE_CHECK(buf != nullptr, "fp8 grouped GEMM: cannot allocate a {}-byte panel buffer", b);
    cap = b;
  }
  return static_cast<uint16_t*>(buf.get());
}

}  // namespace

Tensor unpack_expert_f8(const PackedExperts& p, int64_t e) {
  Job j;
  j.w = static_cast<const char*>(p.data.raw());
  j.expert_stride = p.expert_stride;
  j.panel_stride = panel_elems(p.k, p.dtype);
  j.k = p.k;
  j.f8_scale = p.w_scale.data<float>();
  j.f8_n_kb = p.k / p.block_k;
  j.f8_kb_pairs = p.block_k / 2;
  j.f8_scale_stride = n_panels(p.n, p.gated) * j.f8_n_kb * 2 * kPanel;
  std::vector<uint16_t> panel(static_cast<size_t>(j.panel_stride));
  Tensor out = Tensor::zeros({p.n, p.k}, DType::F32);
  float* o = out.data<float>();
  for (int64_t P = 0; P < n_panels(p.n, p.gated); ++P) {
    dequant_panel_portable(j, e, P, panel.data());
    for (int c = 0; c < kPanel; ++c) {
      const int64_t row = panel_col_to_row(p, P, c);
      if (row < 0) continue;
      for (int64_t k = 0; k < p.k; ++k) o[row * p.k + k] = bf16_to_f32(panel[((k / 2) * kPanel + c) * 2 + (k & 1)]);
    }
  }
  return out;
}

void run_task_f8(const Job& j, const Task& t) {
  const Isa isa = active_isa();
  void (*run_bf16)(const Job&, const Task&) = run_task_portable_bf16;
  switch (isa) {
    case Isa::Amx:
    case Isa::Avx512Bf16: run_bf16 = run_task_avx512bf16; break;
    case Isa::Avx512: run_bf16 = run_task_avx512_bf16emu; break;
    case Isa::Avx2: run_bf16 = run_task_avx2_bf16; break;
    case Isa::Portable: break;
  }
  const int64_t bf16_panel_bytes = j.panel_stride * 2;
  uint16_t* buf = panel_buffer(bf16_panel_bytes);
  if (isa >= Isa::Amx && amx_bf16_fits(j.k)) return run_task_f8_amx(j, t, reinterpret_cast<char*>(buf));
  if (isa >= Isa::Avx512Bf16) return run_task_f8_avx512bf16(j, t, reinterpret_cast<char*>(buf));
  if (isa == Isa::Avx2) return run_task_f8_avx2(j, t, reinterpret_cast<char*>(buf));
  // The bf16 runner reads panel P of expert e at w + e * expert_stride + P * panel_stride:
  // with both strides 0 every (expert, panel) resolves to this thread's buffer.
  Job bj = j;
  bj.w = reinterpret_cast<const char*>(buf);
  bj.expert_stride = 0;
  bj.panel_stride = 0;
  for (int32_t P = t.p0; P < t.p1; ++P) {
    dequant_panel_portable(j, t.expert, P, buf);
    run_bf16(bj, Task{t.expert, P, P + 1});
  }
}

}  // namespace gg
}  // namespace moe
