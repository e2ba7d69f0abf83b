// Private to grouped_gemm*.cpp: the packed weight layout and the per-ISA task runners.
//
// Packed layout (the same for every ISA, so the ISA cap may change after packing):
//   expert e   -> n_panels panels, each kPanel = 64 output columns wide, zero padded.
//   gated (W13): panel P holds gate columns [32P, 32P+32) in columns 0..31 and the
//                matching up columns in 32..63, so one panel yields 32 finished outputs
//                act(gate) * up and the activation fuses into the epilogue.
//   plain (W2):  panel P holds output columns [64P, 64P+64).
//   f32:  panel = [K][64] floats: one k step = 256 contiguous bytes = 4 zmm.
//   bf16: panel = [ceil(K/2)][64][2] (VNNI pairs): one zmm = 16 columns x 2 k, the
//         operand layout of vdpbf16ps; an odd K is padded with a zero k.
//   i8:   panel = [ceil(K/4)][64][4] (VNNI quads): one zmm = 16 columns x 4 k, the
//         signed operand of vpdpbusd; K is padded to a multiple of 4 with zero k. Per
//         packed column an f32 scale and an i32 compensation 128 * sum_k q live in
//         PackedExperts::w_scale / w_comp (same column numbering: panel * 64 + j).
//   f8:   panel = [ceil(K/2)][64][2] bytes: the bf16 layout with one byte per value, so
//         a panel dequantises element by element into a bf16 panel (grouped_gemm_fp8.cpp).
// Every panel starts on a 256-byte boundary (K*256 or ceil(K/2)*256 bytes per panel),
// so given the 128-byte aligned Tensor storage all B loads are aligned.
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm.h"

namespace moe::gg {

inline constexpr int kPanel = 64;      // columns per panel: 4 zmm of f32 accumulators per row
inline constexpr int kGateCols = 32;   // gated: gate (and up) columns per panel
// Experts with at most this many rows run as a weight-streaming GEMV (decode): tasks
// cover several panels, the kernels prefetch the stream into L2 and FP8 converts in
// registers. Above it a task is one panel and rows are register-blocked (prefill).
inline constexpr int64_t kDecodeMaxRows = 4;

// The helpers below are also used by the *_avx2/*_avx512 files, which are compiled with
// wider ISA flags: internal linkage keeps the linker from merging an AVX-512 copy of an
// inline function into baseline code (an ODR hazard of per-file ISA flags).
namespace {

inline int64_t n_panels(int64_t n, bool gated) {
  return gated ? (n / 2 + kGateCols - 1) / kGateCols : (n + kPanel - 1) / kPanel;
}
inline bool pair_layout(DType dt) { return dt == DType::BF16 || dt == DType::F8E4M3; }
inline int64_t k_steps(int64_t k, DType dt) {
  return pair_layout(dt) ? (k + 1) / 2 : dt == DType::I8 ? (k + 3) / 4 : k;
}
// Elements of the packed dtype per panel.
inline int64_t panel_elems(int64_t k, DType dt) {
  return pair_layout(dt) ? k_steps(k, dt) * kPanel * 2 : dt == DType::I8 ? k_steps(k, dt) * kPanel * 4 : k * kPanel;
}

// Logical row of W (gate rows then up rows) held by column j of panel P; -1 = padding.
inline int64_t panel_col_to_row(const PackedExperts& p, int64_t P, int j) {
  if (p.gated) {
    const int64_t half = p.n / 2;
    const int64_t c = P * kGateCols + (j % kGateCols);
    if (c >= half) return -1;
    return j < kGateCols ? c : half + c;
  }
  const int64_t r = P * kPanel + j;
  return r < p.n ? r : -1;
}

}  // namespace

// Everything a task runner needs, resolved once per grouped_gemm call.
struct Job {
  const char* w = nullptr;   // packed data base
  int64_t expert_stride = 0;  // bytes
  int64_t panel_stride = 0;   // bytes
  int64_t k = 0;
  int64_t n_out = 0;  // output columns (n/2 when gated)
  bool gated = false;
  Activation act = Activation::None;
  const char* a = nullptr;
  int64_t lda_bytes = 0;
  const int64_t* offsets = nullptr;
  char* c = nullptr;
  int64_t ldc_bytes = 0;
  DType c_dtype = DType::F32;
  // I8 only: per packed column scale and compensation of expert 0; experts are
  // q_stride columns apart. The A rows' f32 scale sits at byte a_scale_off of each row.
  const float* w_scale = nullptr;
  const int32_t* w_comp = nullptr;
  int64_t q_stride = 0;
  int64_t a_scale_off = 0;
  // F8E4M3 only: PackedExperts::w_scale of expert 0 (experts f8_scale_stride floats
  // apart), k blocks per panel and k pairs per block.
  const float* f8_scale = nullptr;
  int64_t f8_scale_stride = 0;
  int64_t f8_n_kb = 0;
  int64_t f8_kb_pairs = 0;
  // I8 with group-coded weights (grouped_gemm_int4_impl.h): w_scale and q_stride as above
  // but indexed [panel][group][64]; zero points or offsets alike (one of the two is set);
  // k values per group; groups per column (the code width picks the runner).
  const uint8_t* i4_zero = nullptr;
  int i4_uniform_zero = -1;  // >= 0: i4_zero is null and every group's zero point is this
  const float* i4_offset = nullptr;
  int64_t i4_group = 0;
  int64_t i4_n_groups = 0;
  // Super-block scales (PackedExperts::sb_groups > 0): D / M of expert 0, i4_sb_stride
  // entries apart, [panel][super-block][64]; sc / mn as w_scale ([panel][group][64]).
  int64_t i4_sb_groups = 0;
  int64_t i4_sb_stride = 0;
  const uint16_t* i4_sb_d = nullptr;
  const uint16_t* i4_sb_m = nullptr;
  const int8_t* i4_sc = nullptr;
  const uint8_t* i4_mn = nullptr;
  // f32 weights, plain (not gated) output in f32: a decode GEMM of fewer panels than
  // threads (the router's 128 outputs are 2 panels) may be cut into column windows. Each
  // output column's sum is one chain over k whoever computes it, so the bits do not change.
  bool col_windows = false;
};

// One task: rows of `expert` x panels [p0, p1). A column window (Job::col_windows) is a
// decode task of one panel that computes only its 16-column chunks [q0, q1).
inline constexpr int kWindowCols = 16;
inline constexpr int kPanelWindows = kPanel / kWindowCols;
struct Task {
  int32_t expert;
  int32_t p0, p1;
  int8_t q0 = 0, q1 = kPanelWindows;
};

namespace {
// Columns of output produced by panel P (the epilogue stores only these).
inline int valid_cols(const Job& j, int64_t P) {
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t rem = j.n_out - P * per;
  return static_cast<int>(rem < per ? rem : per);
}
inline bool is_window(const Task& t) { return t.q0 != 0 || t.q1 != kPanelWindows; }
// Valid output columns of t's window, counted from its first column 16 q0.
inline int window_cols(const Job& j, const Task& t) {
  const int n = valid_cols(j, t.p0) - kWindowCols * t.q0, w = kWindowCols * (t.q1 - t.q0);
  return n < 0 ? 0 : n < w ? n : w;
}

}  // namespace

// The gated activations, written once over an operations type O (scalar float or a SIMD
// vector) so the scalar act_gate() and every vector epilogue execute the same sequence of
// IEEE operations (explicit fma, no contraction) and agree bit for bit.
//   silu(g)      = g / (1 + exp(-g))
//   gelu_tanh(g) = g * (1 + tanh(y)) / 2 = g / (1 + exp(-2y)),  y = sqrt(2/pi) (g + 0.044715 g^3)
//   gelu_erf(g)  = g * Phi(g),  Phi from erfc (Numerical Recipes' Chebyshev fit, rel. err < 1.2e-7)
// exp: Cody-Waite reduction by ln2 and a degree-6 polynomial (about 1 ulp on the clamped range).
template <class O>
struct ActMath {
  using V = typename O::V;
  static V exp(V x) {
    x = O::min(O::max(x, O::c(-87.0f)), O::c(88.0f));  // keeps 2^n a normal float
    const V n = O::rint(O::mul(x, O::c(1.44269504088896341f)));
    V r = O::fma(n, O::c(-0.693359375f), x);
    r = O::fma(n, O::c(2.12194440e-4f), r);
    V p = O::c(1.9875691500e-4f);
    p = O::fma(p, r, O::c(1.3981999507e-3f));
    p = O::fma(p, r, O::c(8.3334519073e-3f));
    p = O::fma(p, r, O::c(4.1665795894e-2f));
    p = O::fma(p, r, O::c(1.6666665459e-1f));
    p = O::fma(p, r, O::c(5.0000001201e-1f));
    V y = O::fma(p, O::mul(r, r), r);
    y = O::add(y, O::c(1.0f));
    return O::mul(y, O::pow2n(n));
  }
  static V silu(V g) { return O::div(g, O::add(O::c(1.0f), exp(O::sub(O::c(0.0f), g)))); }
  static V gelu_tanh(V g) {
    const V s = O::fma(O::c(0.044715f), O::mul(g, g), O::c(1.0f));
    const V z = O::mul(O::mul(O::c(-1.5957691216057308f), g), s);  // -2 sqrt(2/pi) g (1 + 0.044715 g^2)
    return O::div(g, O::add(O::c(1.0f), exp(z)));
  }
  static V gelu_erf(V g) {
    const V z = O::mul(O::abs(g), O::c(0.70710678118654752f));
    const V t = O::div(O::c(1.0f), O::fma(O::c(0.5f), z, O::c(1.0f)));
    V p = O::c(0.17087277f);
    p = O::fma(p, t, O::c(-0.82215223f));
    p = O::fma(p, t, O::c(1.48851587f));
    p = O::fma(p, t, O::c(-1.13520398f));
    p = O::fma(p, t, O::c(0.27886807f));
    p = O::fma(p, t, O::c(-0.18628806f));
    p = O::fma(p, t, O::c(0.09678418f));
    p = O::fma(p, t, O::c(0.37409196f));
    p = O::fma(p, t, O::c(1.00002368f));
    const V arg = O::fma(O::sub(O::c(0.0f), z), z, O::fma(t, p, O::c(-1.26551223f)));
    const V h = O::mul(O::c(0.5f), O::mul(t, exp(arg)));  // erfc(z) / 2 = Phi(-|g|)
    return O::mul(g, O::select_nonneg(g, O::sub(O::c(1.0f), h), h));
  }
  static V gate(Activation act, V g) {
    switch (act) {
      case Activation::SiluMul: return silu(g);
      case Activation::GeluTanhMul: return gelu_tanh(g);
      case Activation::GeluErfMul: return gelu_erf(g);
      case Activation::None: break;
    }
    return g;
  }
};

// Task runners; all compute exactly the contract of grouped_gemm for one task.
void run_task_portable_f32(const Job& j, const Task& t);
void run_task_portable_bf16(const Job& j, const Task& t);
void run_task_avx2_f32(const Job& j, const Task& t);
void run_task_avx2_bf16(const Job& j, const Task& t);
void run_task_avx512_f32(const Job& j, const Task& t);
void run_task_avx512_bf16emu(const Job& j, const Task& t);  // bf16 weights, no AVX512_BF16
void run_task_avx512bf16(const Job& j, const Task& t);     // vdpbf16ps
// AMX-BF16 tiles (grouped_gemm_amx.cpp), decode and prefill, for weights whose K fits the
// tiles' k steps of 32 (amx_bf16_fits); other K run vdpbf16ps, every row alike.
namespace {  // internal linkage: see the ODR note above
inline bool amx_bf16_fits(int64_t k) { return k % 32 == 0; }
}  // namespace
void run_task_amx_bf16(const Job& j, const Task& t);
void run_task_portable_i8(const Job& j, const Task& t);    // grouped_gemm_int8.cpp
// I8 pieces of packing and the reference (grouped_gemm_int8.cpp).
void alloc_q8(PackedExperts& p);
void pack_expert_i8(PackedExperts& p, int64_t e, const Tensor& w);
// The float rows of one expert's [n, k] weight as the I8 packer reads them, one row at
// a time: row r < top_rows is top + r * top_stride, else bottom + (r - top_rows) *
// bottom_stride (gated W13: gate rows then up rows, no stacked copy), each k contiguous
// values of `dtype` (f32, bf16 or f16; e.g. a view of the mmapped checkpoint).
struct FloatRows {
  const char* top = nullptr;
  int64_t top_stride = 0, top_rows = 0;  // bytes, rows
  const char* bottom = nullptr;
  int64_t bottom_stride = 0;  // bytes
  DType dtype = DType::F32;
  const char* row(int64_t r) const { return r < top_rows ? top + r * top_stride : bottom + (r - top_rows) * bottom_stride; }
};
// pack_expert_i8 from rows: each row is converted to f32, multiplied by the smooth
// vector and quantised on its own, so the staging is one row of k floats, never a float
// copy of the expert (a [V, H] lm_head under --quantize-linears is one "expert").
void pack_expert_i8_rows(PackedExperts& p, int64_t e, const FloatRows& rows);
Tensor unpack_expert_i8(const PackedExperts& p, int64_t e);
void reference_i8(const GroupedGemmParams& p);
void run_task_avx512_vnni_i8(const Job& j, const Task& t);  // vpdpbusd, grouped_gemm_int8_avx512.cpp
void run_task_avx2_i8(const Job& j, const Task& t);  // vpmaddubsw + vpmaddwd, grouped_gemm_int8_avx2.cpp
// F8E4M3 (grouped_gemm_fp8.cpp): dequantise panel by panel to bf16, then the bf16 runner.
void run_task_f8(const Job& j, const Task& t);
Tensor unpack_expert_f8(const PackedExperts& p, int64_t e);
// Dequantises k pairs [p0, p1) of panel P of expert e of the job's F8 weights into the
// same pairs of dst, a bf16 panel (64-byte aligned): dst[i] = bf16(e4m3(src[i]) *
// scale[i]). AVX512-BF16 (grouped_gemm_fp8_avx512.cpp); portable: grouped_gemm_fp8.cpp.
void dequant_pairs_f8_avx512bf16(const Job& j, int64_t e, int64_t P, int64_t p0, int64_t p1, uint16_t* dst);
// The F8 task with vdpbf16ps (grouped_gemm_avx512.cpp); buf: a bf16 panel's bytes.
void run_task_f8_avx512bf16(const Job& j, const Task& t, char* buf);
// The F8 task on AMX-BF16 tiles (grouped_gemm_amx.cpp; K: amx_bf16_fits); buf as above.
void run_task_f8_amx(const Job& j, const Task& t, char* buf);
// The same two on AVX2 (grouped_gemm_avx2.cpp): decode converts in registers, prefill
// dequantises a panel into buf (64-byte aligned) and runs the AVX2 bf16 kernel on it.
void dequant_pairs_f8_avx2(const Job& j, int64_t e, int64_t P, int64_t p0, int64_t p1, uint16_t* dst);
void run_task_f8_avx2(const Job& j, const Task& t, char* buf);

// W4A8 (grouped_gemm_int4.cpp; runners in grouped_gemm_int4_avx2.cpp and, on AVX512-VNNI
// machines, grouped_gemm_int4_avx512.cpp).
void fill_job_i4(const PackedExperts& p, Job& j);
void pack_expert_i4(PackedExperts& p, int64_t e, const Tensor& w);
Tensor unpack_expert_i4(const PackedExperts& p, int64_t e);
void reference_i4(const GroupedGemmParams& p);
void run_task_portable_i4(const Job& j, const Task& t);
void run_task_avx2_i4(const Job& j, const Task& t);
void run_task_avx512_vnni_i4(const Job& j, const Task& t);  // vpdpbusd, grouped_gemm_int4_avx512.cpp
// 8-bit codes (code_bits 8): portable in grouped_gemm_int4.cpp, the others beside their int4 runners.
void run_task_portable_g8(const Job& j, const Task& t);
void run_task_avx2_g8(const Job& j, const Task& t);
void run_task_avx512_vnni_g8(const Job& j, const Task& t);
// 6-bit codes (code_bits 6), likewise.
void run_task_portable_g6(const Job& j, const Task& t);
void run_task_avx2_g6(const Job& j, const Task& t);
void run_task_avx512_vnni_g6(const Job& j, const Task& t);
// The three on AMX-INT8 tiles (grouped_gemm_int4_amx.cpp): prefill tasks there, decode
// tasks (<= kDecodeMaxRows rows) passed to the VNNI runners above.
void run_task_amx_i4(const Job& j, const Task& t);
void run_task_amx_g8(const Job& j, const Task& t);
void run_task_amx_g6(const Job& j, const Task& t);

}  // namespace moe::gg
