// The ggml tensor types a GGUF file can hold, and their block formats.
//
// A ggml tensor row of ne[0] weights is stored as ne[0] / block_size blocks of
// block_bytes bytes each (plain types: block_size 1). The ids are those of ggml's
// `enum ggml_type` (gaps are ids ggml retired); the byte layouts are those of
// ggml-common.h, described next to each decoder in gguf_types.cpp.
//
// Two ways to read a row of a supported type:
//   dequantize_row  the reference: f32 values, computed with exactly the f32
//                   operations ggml's reference dequantisers do, in their order, so the
//                   bits equal ggml's (and gguf-py's, which does the same operations);
//   decompose_row   the form the engine keeps quantised weights in: per weight an
//                   unsigned integer code q in [0, 2^bits), per group of 16 or 32 weights
//                   an f32 scale and offset, with  w = scale * q - offset  equal to
//                   dequantize_row's value bit for bit, except that a zero always comes
//                   out as +0 where the reference may give -0 (see decompose_row). The
//                   tests GgufFixture.Decomposition* and GgufDecompose.* check this for
//                   every type.
// For every supported type every product in these formulas is exact in f32 (an f16
// significand of 11 bits times small integers stays under 24 bits; see the comment at
// decompose_row in gguf_types.cpp), so each weight takes at most one rounding: the
// results are the same whether or not a compiler fuses a multiply and an add into an
// FMA (ggml's own build may), which is why exact equality is a fair demand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moe::gguf {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3,
  // 4 and 5 were Q4_2 / Q4_3, removed from ggml before GGUF existed.
  Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  // 31-33 and 36-38 were the repacked Q4_0_x_y / IQ4_NL_x_y types, no longer allowed in files.
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;      // as gguf-py spells it: "Q4_K", "BF16", ...
  int64_t block_size;    // weights per block
  uint64_t block_bytes;  // bytes per block
  bool supported;        // this engine can dequantise / decompose it
};

// nullptr for an id that is not a ggml type (unknown or retired).
const GgmlTypeInfo* ggml_type_info(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType t);
inline const char* ggml_type_name(GgmlType t) { return ggml_type_info(t).name; }
inline bool ggml_type_supported(GgmlType t) { return ggml_type_info(t).supported; }
// "F32, F16, BF16, Q8_0, ..." (the supported ones, for error messages).
std::string ggml_supported_types();
// "F32 (0), F16 (1), ..." (every known id, for error messages).
std::string ggml_known_types();

// Throws moe::Error naming the tensor, the file, the type and the supported list
// unless `t` is supported.
void require_supported(GgmlType t, const std::string& tensor, const std::string& file);

// Bytes of a row of n weights; n must be a multiple of the block size (checked).
uint64_t ggml_row_bytes(GgmlType t, int64_t n);

// Dequantises one row: n weights (a multiple of the block size, checked) from the
// blocks at src (unaligned is fine) into dst[n]. Throws for unsupported types.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// How decompose_row groups a type's weights: codes q in [0, 2^bits), one scale and
// one offset per `group_size` consecutive weights of a row.
struct GroupLayout {
  int group_size = 32;  // 16 (Q6_K) or 32 (the others)
  int bits = 4;
  // The code of w = 0 for the symmetric types (Q4_0 8, Q5_0 16, Q8_0 128, Q6_K 32), whose
  // weights are (q - zero) * scale exactly; -1 for those with a float min (Q4_1, Q5_1,
  // Q4_K, Q5_K), which need the offset.
  int zero = -1;
};
// nullopt for types that are not integer-coded (F32, F16, BF16) or not supported.
std::optional<GroupLayout> group_layout(GgmlType t);

// Where decompose_row writes one row of n weights.
struct RowGroups {
  uint8_t* q = nullptr;       // [n] codes in [0, 2^bits)
  float* scale = nullptr;     // [n / group_size]
  float* offset = nullptr;    // [n / group_size]
};

// Splits one row of an integer-coded type into codes, scales and offsets (see the
// top of this file and GroupLayout). For every weight j of group g:
//   float w = scale[g] * float(q[j]) - offset[g];   (the product is exact, so fused or not)
// gives dequantize_row's value bit for bit when the block's f16 scales are finite, with
// one exception: for the symmetric types (Q4_0, Q5_0, Q8_0, Q6_K, whose reference is
// (code - zero point) * d), a zero result is always +0 while the reference gives -0 for a
// negative d. -0 and +0 are equal as numbers and as addends of any sum that is not
// itself all zeros. Throws for types without a GroupLayout or n not a multiple of the
// block size.
void decompose_row(GgmlType t, const void* src, int64_t n, const RowGroups& out);

// The K-quants' super-blocks (256 weights): groups per super-block, 8 for Q4_K / Q5_K
// (groups of 32), 16 for Q6_K (groups of 16); nullopt for the other types.
std::optional<int> superblock_groups(GgmlType t);
// Where decompose_row_sb writes one row of n weights (n / 256 blocks).
struct RowSuperBlocks {
  uint8_t* q = nullptr;    // [n] codes, as decompose_row's
  uint16_t* d = nullptr;   // [n / 256] the block's f16 d (bits)
  uint16_t* m = nullptr;   // [n / 256] its f16 dmin (Q4_K, Q5_K; null for Q6_K)
  int8_t* sc = nullptr;    // [n / group] each group's scale factor (6-bit; Q6_K's signed 8-bit)
  uint8_t* mn = nullptr;   // [n / group] each group's min factor (Q4_K, Q5_K; null for Q6_K)
};
// Splits one row of a K-quant into codes and the factors of decompose_row's scales and
// offsets: for group g of block b, decompose_row's scale is f16_to_f32(d[b]) * sc[g] and
// its offset f16_to_f32(m[b]) * mn[g] (Q6_K: 32 * scale), the same f32 products.
void decompose_row_sb(GgmlType t, const void* src, int64_t n, const RowSuperBlocks& out);

}  // namespace moe::gguf
