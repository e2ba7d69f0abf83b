// Private to grouped_gemm.cpp and grouped_gemm_int8.cpp (baseline x86-64):
// the plain-C++ task runner, written so the compiler vectorises it for whichever ISA the
// including file is compiled for. Everything here has internal linkage (see the ODR note
// in grouped_gemm_impl.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

struct ScalarOps {
  using V = float;
  static V c(float x) { return x; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V min(V a, V b) { return b < a ? b : a; }
  static V max(V a, V b) { return a < b ? b : a; }
  static V abs(V a) { return std::fabs(a); }
  static V rint(V a) { return std::nearbyint(a); }
  static V pow2n(V n) {  // n integral in [-126, 127]
    const uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static V select_nonneg(V g, V a, V b) { return g >= 0.0f ? a : b; }
};

inline float g_bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t g_f32_to_bf16(float f) {  // RNE, same bits as moe::f32_to_bf16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

constexpr int kGenericMaxRows = 4;
constexpr int kChunk = 16;  // columns per accumulator chunk: 16 x MR floats stay in registers

// tile[r][0..63] = rows r of A x panel, f32. A is f32 (TA = float) or bf16 (TA = uint16_t).
// Only the chunks [q0, q1) of 16 columns are computed (a column window: Task::q0, q1).
template <class TA, int MR>
void generic_block(const Job& j, const char* panel, const char* a0, float* tile, int q0 = 0,
                   int q1 = kPanel / kChunk) {
  static_assert(kChunk == kWindowCols, "a column window is whole chunks");
  const int64_t K = j.k;
  for (int q = q0; q < q1; ++q) {
    float acc[MR][kChunk] = {};
    if constexpr (sizeof(TA) == 4) {
      const float* B = reinterpret_cast<const float*>(panel) + q * kChunk;
      for (int64_t k = 0; k < K; ++k) {
        const float* b = B + k * kPanel;
        for (int r = 0; r < MR; ++r) {
          const float av = reinterpret_cast<const float*>(a0 + r * j.lda_bytes)[k];
          for (int c = 0; c < kChunk; ++c) acc[r][c] += av * b[c];
        }
      }
    } else {
      const uint32_t* B = reinterpret_cast<const uint32_t*>(panel) + q * kChunk;
      const int64_t K2 = (K + 1) / 2;
      for (int64_t p = 0; p < K2; ++p) {
        const uint32_t* b = B + p * kPanel;
        float be[kChunk], bo[kChunk];
        for (int c = 0; c < kChunk; ++c) {
          be[c] = g_bits_to_f32(b[c] << 16);
          bo[c] = g_bits_to_f32(b[c] & 0xffff0000u);
        }
        for (int r = 0; r < MR; ++r) {
          const uint16_t* ar = reinterpret_cast<const uint16_t*>(a0 + r * j.lda_bytes);
          const float ae = g_bits_to_f32(static_cast<uint32_t>(ar[2 * p]) << 16);
          const float ao = 2 * p + 1 < K ? g_bits_to_f32(static_cast<uint32_t>(ar[2 * p + 1]) << 16) : 0.0f;
          for (int c = 0; c < kChunk; ++c) acc[r][c] += ae * be[c] + ao * bo[c];
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < kChunk; ++c) tile[r * kPanel + q * kChunk + c] = acc[r][c];
  }
}

// One row of f32 values t[64] (packed column order: gated = 32 gate then 32 up) ->
// act(gate) * up or the plain values, stored as c_dtype into columns [col0, col0 + nv)
// of crow. The scalar epilogue of every portable runner (float, int8, int4).
inline void scalar_epilogue_row(const Job& j, const float* t, char* crow, int64_t col0, int nv) {
  float out[kPanel];
  if (j.gated) {
    for (int c = 0; c < nv; ++c) out[c] = ActMath<ScalarOps>::gate(j.act, t[c]) * t[kGateCols + c];
  } else {
    for (int c = 0; c < nv; ++c) out[c] = t[c];
  }
  if (j.c_dtype == DType::F32) {
    std::memcpy(reinterpret_cast<float*>(crow) + col0, out, nv * sizeof(float));
  } else {
    uint16_t* o = reinterpret_cast<uint16_t*>(crow) + col0;
    for (int c = 0; c < nv; ++c) o[c] = g_f32_to_bf16(out[c]);
  }
}

inline void generic_epilogue(const Job& j, const float* tile, int rows, char* c0, int64_t col0, int nv) {
  for (int r = 0; r < rows; ++r) scalar_epilogue_row(j, tile + r * kPanel, c0 + r * j.ldc_bytes, col0, nv);
}

template <class TA>
void generic_run_task(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int64_t nb = (rows + kGenericMaxRows - 1) / kGenericMaxRows;
  alignas(64) float tile[kGenericMaxRows * kPanel];
  if (is_window(t)) {  // decode rows (<= kGenericMaxRows) x part of one f32 panel, stored straight to C
    const char* panel = j.w + t.expert * j.expert_stride + t.p0 * j.panel_stride;
    const char* a = j.a + r0 * j.lda_bytes;
    switch (rows) {
      case 1: generic_block<TA, 1>(j, panel, a, tile, t.q0, t.q1); break;
      case 2: generic_block<TA, 2>(j, panel, a, tile, t.q0, t.q1); break;
      case 3: generic_block<TA, 3>(j, panel, a, tile, t.q0, t.q1); break;
      default: generic_block<TA, 4>(j, panel, a, tile, t.q0, t.q1); break;
    }
    const int64_t col0 = t.p0 * kPanel + kWindowCols * t.q0;
    const size_t bytes = static_cast<size_t>(window_cols(j, t)) * sizeof(float);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(reinterpret_cast<float*>(j.c + (r0 + r) * j.ldc_bytes) + col0, tile + r * kPanel + kWindowCols * t.q0,
                  bytes);
    return;
  }
  for (int64_t P = t.p0; P < t.p1; ++P) {
    const char* panel = j.w + t.expert * j.expert_stride + P * j.panel_stride;
    const int nv = valid_cols(j, P);
    int64_t row = r0;
    for (int64_t b = 0; b < nb; ++b) {  // blocks of near-equal size <= kGenericMaxRows
      const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
      const char* a = j.a + row * j.lda_bytes;
      switch (mr) {
        case 1: generic_block<TA, 1>(j, panel, a, tile); break;
        case 2: generic_block<TA, 2>(j, panel, a, tile); break;
        case 3: generic_block<TA, 3>(j, panel, a, tile); break;
        default: generic_block<TA, 4>(j, panel, a, tile); break;
      }
      generic_epilogue(j, tile, mr, j.c + row * j.ldc_bytes, P * per, nv);
      row += mr;
    }
  }
}

}  // namespace
}  // namespace moe::gg
