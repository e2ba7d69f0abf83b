// Element types and the bf16/f16 <-> f32 conversions every kernel uses.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moe {

// Compute types first; the rest exist so checkpoints can describe every tensor they hold.
enum class DType : uint8_t { F32, BF16, F16, I8, I32, I64, U8, F64, I16, Bool, F8E4M3, F8E5M2 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);           // "f32", "bf16", ...
DType parse_dtype(std::string_view name);  // accepts "f32"/"float32", "bf16"/"bfloat16", ...
// The float types a weight's values are read from (f64 and FP8 have their own paths).
inline bool is_float_weight(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// bf16 is the top half of an IEEE f32. Round-to-nearest-even, as the AVX512_BF16
// vcvtneps2bf16 instruction does, so scalar and vector paths produce the same bits.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds an f32 to the nearest bf16 value and back (what a bf16 store then load does).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of type `src_type` at src into f32 at dst.
void convert_to_f32(const void* src, DType src_type, float* dst, size_t n);
// Converts n f32 values into `dst_type` (F32 or BF16 or F16) at dst.
void convert_from_f32(const float* src, void* dst, DType dst_type, size_t n);

}  // namespace moe
