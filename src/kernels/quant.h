// Quantisation for the W8A8 (SmoothQuant) experts and FP8 block-scaled weights.
//
// One rounding rule everywhere (activations, weights, the references, the dispatch
// sender): symmetric int8 over a vector v (a row of activations divided by the smooth
// vector, or one output channel of a weight):
//   amax  = max_k |v[k]|
//   scale = amax / 127            (f32 division; 0 when amax == 0)
//   q[k]  = clamp(nearbyint(v[k] * (127 / amax)), -127, 127)   (round half to even)
// and v = x / smooth (f32 division; skipped when there is no smooth vector: x / 1 == x).
// The AVX-512 path performs exactly these IEEE operations, so it agrees bit for bit
// with the scalar one (max is exact in any order). NaN inputs give unspecified (but
// defined) values.
//
// A Q8 row is how quantised activations live in memory, in the experts' A operand and
// in the int8 dispatch payload alike:
//   [int8 q[0..k)] [zero pad to a multiple of 4] [f32 scale]   = q8_row_bytes(k) bytes
// The scale tail keeps each token self-describing when it travels alone, and the pad
// keeps the scale 4-byte aligned and lets the kernels read whole k quads.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/permute.h"

namespace moe {

inline constexpr int64_t q8_scale_offset(int64_t k) { return (k + 3) / 4 * 4; }
inline constexpr int64_t q8_row_bytes(int64_t k) { return q8_scale_offset(k) + 4; }
float q8_row_scale(const void* row, int64_t k);

// Quantises one row x[k] (f32) divided by smooth[k] (null: no smooth) into a Q8 row at
// dst (q8_row_bytes(k) bytes). Picks the AVX-512 or AVX2 path when the active ISA has it.
void quantize_row_q8(const float* x, const float* smooth, int64_t k, void* dst);
// The scalar path, the definition the vector path must match (tests).
void quantize_row_q8_reference(const float* x, const float* smooth, int64_t k, void* dst);
// Symmetric int8 of one weight row w[k] into q[k]; returns its scale (amax / 127).
float quantize_weight_row(const float* w, int64_t k, int8_t* q);

// Static activation quantisation (checkpoints calibrated offline, e.g. FastDeploy W8A8):
// one fixed per-tensor step s > 0 (x ~= q * s) replaces the row's absmax:
//   q[k] = clamp(nearbyint(v[k] / s), -127, 127)    (f32 division, round half to even)
// with v = x / smooth as above, and the Q8 row's scale is s. Values past 127 * s
// saturate: a calibrated range is not a bound on new inputs. Same clamp (and NaN ->
// -127) as the dynamic rule; the AVX-512 path performs the same IEEE operations.
void quantize_row_q8_static(const float* x, const float* smooth, int64_t k, float s, void* dst);
void quantize_row_q8_static_reference(const float* x, const float* smooth, int64_t k, float s, void* dst);

// rows rows of x (f32, bf16 or f16; ldx elements apart) -> Q8 rows dst (ld_dst bytes
// apart). Row r uses the smooth vector of its expert: with offsets (rows of expert e
// are [offsets[e], offsets[e+1]), offsets[0] == 0) and smooth [n_experts, k], row r's
// expert e has smooth + e * k; smooth == null: no smooth. offsets == null: one group.
struct QuantizeRowsParams {
  const void* x = nullptr;
  DType x_dtype = DType::F32;
  int64_t ldx = 0;
  int64_t rows = 0;
  int64_t k = 0;
  const int64_t* offsets = nullptr;
  int64_t n_experts = 1;
  const float* smooth = nullptr;
  // [n_experts] static per-tensor step of each group (quantize_row_q8_static); null:
  // dynamic, each row's own absmax.
  const float* static_scale = nullptr;
  void* dst = nullptr;
  int64_t ld_dst = 0;  // bytes, >= q8_row_bytes(k)
};
void quantize_rows_q8(const QuantizeRowsParams& p);

// Expand + smooth + quantise in one pass (the W8A8 form of moe::expand): out row r =
// Q8(x[gather_idx[offsets[begin] + r]] / smooth[expert of r]), rows q8_row_bytes(H)
// apart. smooth: [end - begin, H] for the experts [begin, end), or null. static_scale:
// [end - begin] static steps of those experts, or null (dynamic). p.out_dtype is ignored.
void expand_quantize_q8(const ExpandParams& p, const float* smooth, const float* static_scale = nullptr);

// FP8 E4M3 ("e4m3fn": no infinities; 0x7f and 0xff are NaN; max 448) -> f32, exact.
float f8e4m3_to_f32(uint8_t bits);
// Dequantises an F8E4M3 weight [n, k] with DeepSeek-V3 block scales: scale_inv
// [n / block_n, k / block_k] (f32, bf16 or f16) multiplies every element of its block:
//   out[i, j] = f8e4m3_to_f32(w[i, j]) * scale_inv[i / block_n, j / block_k]  (f32 multiply)
// then rounded to out_dtype (F32 or BF16, round to nearest even). Throws naming both
// shapes when a block does not divide the weight or scale_inv has the wrong shape.
// Callers dequantise one expert at a time (the loader packs it right away), so a whole
// checkpoint is never held dequantised.
Tensor dequantize_fp8_blocks(const Tensor& w, const Tensor& scale_inv, int64_t block_n = 128, int64_t block_k = 128,
                             DType out_dtype = DType::BF16);

namespace quant_detail {
void quantize_row_q8_avx512(const float* x, const float* smooth, int64_t k, void* dst);  // quant_avx512.cpp
void quantize_row_q8_static_avx512(const float* x, const float* smooth, int64_t k, float s, void* dst);
void quantize_row_q8_avx2(const float* x, const float* smooth, int64_t k, void* dst);  // quant_avx2.cpp
void quantize_row_q8_static_avx2(const float* x, const float* smooth, int64_t k, float s, void* dst);
}

}  // namespace moe
