#include "loader/gguf/gguf_types.h"

#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace moe::gguf {

namespace {

constexpr int64_t kQK = 256;  // weights per K-quant super-block

// Block sizes and bytes per block as ggml-common.h defines the block structs (sums of
// their members; QK_K = 256). Retired ids have no entry.
constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::Q4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::Q5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::Q8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::Q8_1, "Q8_1", 32, 4 + 4 + 32, false},
    {GgmlType::Q2_K, "Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, false},
    {GgmlType::Q3_K, "Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, false},
    {GgmlType::Q4_K, "Q4_K", kQK, 2 + 2 + 12 + kQK / 2, true},
    {GgmlType::Q5_K, "Q5_K", kQK, 2 + 2 + 12 + kQK / 8 + kQK / 2, true},
    {GgmlType::Q6_K, "Q6_K", kQK, kQK / 2 + kQK / 4 + kQK / 16 + 2, true},
    {GgmlType::Q8_K, "Q8_K", kQK, 4 + kQK + kQK / 8, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", kQK, 2 + kQK / 4, false},
    {GgmlType::IQ2_XS, "IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, false},
    {GgmlType::IQ1_S, "IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 2 + 16, false},
    {GgmlType::IQ3_S, "IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, false},
    {GgmlType::IQ2_S, "IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, false},
    {GgmlType::IQ4_XS, "IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64, false},
    {GgmlType::I8, "I8", 1, 1, false},
    {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},
    {GgmlType::IQ1_M, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
    {GgmlType::TQ1_0, "TQ1_0", kQK, 2 + 4 * 13, false},
    {GgmlType::TQ2_0, "TQ2_0", kQK, 2 + 64, false},
    {GgmlType::MXFP4, "MXFP4", 32, 1 + 16, false},
    {GgmlType::NVFP4, "NVFP4", 64, 4 + 32, false},
    {GgmlType::Q1_0, "Q1_0", 128, 2 + 16, false},
};

// The order error messages list the supported types in.
constexpr GgmlType kSupportedOrder[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                                        GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

inline uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline float half_at(const uint8_t* p) { return f16_to_f32(le16(p)); }

// ---------------------------------------------------------------------------------------
// Every integer-coded type, unpacked one block at a time into what both the reference
// dequantisation and the decomposition read: a code per weight and, per group, the
// f32 factors exactly as ggml's dequantiser computes them (same operands, same order).

// How the reference turns a code into a weight.
enum class Form {
  Symmetric,  // w = float(q - zero) * d          (Q4_0, Q5_0, Q8_0, Q6_K)
  MinusMin,   // w = d * float(q) - m             (Q4_K, Q5_K: d = d*sc, m = dmin*min)
  PlusMin,    // w = d * float(q) + m             (Q4_1, Q5_1: m is the block's f16 min)
};

struct Format {
  Form form;
  int zero;        // Symmetric only: the code of w = 0
  int group_size;  // weights sharing one (d, m)
  int bits;
};

struct Block {
  uint8_t own[kQK];
  // Where unpack writes the codes in [0, 2^bits), one per weight of the block: own, or
  // straight into a caller's row (decompose_row: no copy per block).
  uint8_t* q = own;
  float d[16];     // per group
  float m[16];     // per group (MinusMin, PlusMin)
  // The K-quants' factors of d and m: d[g] = f16(d_bits) * sc[g], m[g] = f16(m_bits) * mn[g].
  uint16_t d_bits = 0, m_bits = 0;
  int8_t sc[16] = {};
  uint8_t mn[16] = {};
};

Format format_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {Form::Symmetric, 8, 32, 4};
    case GgmlType::Q5_0: return {Form::Symmetric, 16, 32, 5};
    case GgmlType::Q8_0: return {Form::Symmetric, 128, 32, 8};
    case GgmlType::Q6_K: return {Form::Symmetric, 32, 16, 6};
    case GgmlType::Q4_1: return {Form::PlusMin, 0, 32, 4};
    case GgmlType::Q5_1: return {Form::PlusMin, 0, 32, 5};
    case GgmlType::Q4_K: return {Form::MinusMin, 0, 32, 4};
    case GgmlType::Q5_K: return {Form::MinusMin, 0, 32, 5};
    default: MOE_FAIL("internal: {} is not an integer-coded type", ggml_type_name(t));
  }
}

// Q4_0 / Q4_1 nibbles: byte j of qs holds weight j (low nibble) and weight j + 16 (high).
void nibbles32(const uint8_t* qs, uint8_t* __restrict q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0xF;
    q[j + 16] = qs[j] >> 4;
  }
}

// Q5_0 / Q5_1: the nibbles as above plus a fifth bit, bit j of the little-endian u32 qh
// for weight j.
void fives32(const uint8_t* qh4, const uint8_t* qs, uint8_t* __restrict q) {
  const uint32_t qh = uint32_t(qh4[0]) | uint32_t(qh4[1]) << 8 | uint32_t(qh4[2]) << 16 | uint32_t(qh4[3]) << 24;
  nibbles32(qs, q);
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(q[j] | (((qh >> j) & 1u) << 4));
}

// Q4_K / Q5_K: 12 bytes hold eight 6-bit scales and eight 6-bit mins. Sub-blocks 0-3:
// low 6 bits of bytes 0-3 (scales) and 4-7 (mins). Sub-blocks 4-7: low 4 bits in the
// nibbles of bytes 8-11 (scale low, min high), top 2 bits in the top 2 bits of bytes 0-3
// (scales) and 4-7 (mins).
void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K: {f16 d, f16 dmin, u8 scales[12], u8 qs[128]}. Weights come in 4 chunks of 64;
// chunk c reads qs[32c .. 32c+32): low nibbles are sub-block 2c, high nibbles 2c+1.
// Q5_K: {f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]}: the same nibbles plus
// a fifth bit, bit k of qh[l] for weight l of sub-block k.
void unpack_k45(const uint8_t* b, bool five, Block* out) {
  const float d = half_at(b), dmin = half_at(b + 2);
  out->d_bits = le16(b);
  out->m_bits = le16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five ? b + 16 + 32 : b + 16;
  uint8_t* __restrict q = out->q;  // a caller's row: restrict keeps the loops vectorised
  for (int sb = 0; sb < 8; ++sb) {
    int sc = 0, mn = 0;
    k_scale_min(scales, sb, &sc, &mn);
    out->d[sb] = d * static_cast<float>(sc);    // ggml: d1 = d * sc
    out->m[sb] = dmin * static_cast<float>(mn);  // ggml: m1 = min * m
    out->sc[sb] = static_cast<int8_t>(sc);       // 6 bits: fits
    out->mn[sb] = static_cast<uint8_t>(mn);
    const uint8_t* src = qs + 32 * (sb / 2);
    const int shift = (sb % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      int code = (src[l] >> shift) & 0xF;
      if (five) code |= ((qh[l] >> sb) & 1) << 4;
      q[32 * sb + l] = static_cast<uint8_t>(code);
    }
  }
}

// Q6_K: {u8 ql[128], u8 qh[64], i8 scales[16], f16 d}. Two halves of 128 weights; half h
// reads ql[64h ..), qh[32h ..). Weight 32k + l of a half (k = 0..3, l = 0..31): low 4 bits
// from ql[l + 32 (k % 2)] (low nibble for k < 2, high for k >= 2), high 2 bits from bits
// 2k, 2k+1 of qh[l]. Scale: scales[w / 16] for weight w of the block; the factor is
// d * scale, as ggml computes it (d * sc[is] * q evaluates left to right).
void unpack_q6_k(const uint8_t* b, Block* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* scales = b + 128 + 64;
  const float d = half_at(b + 128 + 64 + 16);
  out->d_bits = le16(b + 128 + 64 + 16);
  for (int g = 0; g < 16; ++g) {
    const auto sc = static_cast<int8_t>(scales[g]);
    out->d[g] = d * static_cast<float>(sc);
    out->m[g] = 0.0f;
    out->sc[g] = sc;
  }
  uint8_t* __restrict q = out->q;  // as in unpack_k45
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[64 * h + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xF;
        const int hi = (qh[32 * h + l] >> (2 * k)) & 3;
        q[128 * h + 32 * k + l] = static_cast<uint8_t>(lo | (hi << 4));
      }
}

// One block of type t at b into out (block_size weights, block_size / group_size groups).
void unpack(GgmlType t, const uint8_t* b, Block* out) {
  switch (t) {
    case GgmlType::Q4_0:  // {f16 d, u8 qs[16]}
      out->d[0] = half_at(b);
      nibbles32(b + 2, out->q);
      return;
    case GgmlType::Q4_1:  // {f16 d, f16 m, u8 qs[16]}
      out->d[0] = half_at(b);
      out->m[0] = half_at(b + 2);
      nibbles32(b + 4, out->q);
      return;
    case GgmlType::Q5_0:  // {f16 d, u8 qh[4], u8 qs[16]}
      out->d[0] = half_at(b);
      fives32(b + 2, b + 6, out->q);
      return;
    case GgmlType::Q5_1:  // {f16 d, f16 m, u8 qh[4], u8 qs[16]}
      out->d[0] = half_at(b);
      out->m[0] = half_at(b + 2);
      fives32(b + 4, b + 8, out->q);
      return;
    case GgmlType::Q8_0: {  // {f16 d, i8 qs[32]}: code = qs + 128, so the zero point is 128
      out->d[0] = half_at(b);
      uint8_t* __restrict q = out->q;
      for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(b[2 + j] ^ 0x80);
      return;
    }
    case GgmlType::Q4_K: unpack_k45(b, false, out); return;
    case GgmlType::Q5_K: unpack_k45(b, true, out); return;
    case GgmlType::Q6_K: unpack_q6_k(b, out); return;
    default: MOE_FAIL("internal: {} is not an integer-coded type", ggml_type_name(t));
  }
}

bool integer_coded(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

void check_row(GgmlType t, int64_t n, const char* what) {
  const GgmlTypeInfo& info = ggml_type_info(t);
  MOE_CHECK(info.supported, "{}: type {} is not supported (supported: {})", what, info.name, ggml_supported_types());
  MOE_CHECK(n >= 0 && n % info.block_size == 0, "{}: a row of {} {} weights, expected a multiple of the block size {}",
            what, n, info.name, info.block_size);
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType t) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t));
  MOE_CHECK(info, "internal: ggml type id {} is not in the table", static_cast<uint32_t>(t));
  return *info;
}

std::string ggml_supported_types() {
  std::string s;
  for (GgmlType t : kSupportedOrder) s += (s.empty() ? "" : ", ") + std::string(ggml_type_name(t));
  return s;
}

std::string ggml_known_types() {
  std::string s;
  for (const auto& t : kTypes) s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", t.name, uint32_t(t.type));
  return s;
}

void require_supported(GgmlType t, const std::string& tensor, const std::string& file) {
  MOE_CHECK(ggml_type_supported(t), "gguf file '{}': tensor '{}' has type {}, which this engine cannot read "
            "(supported: {})", file, tensor, ggml_type_name(t), ggml_supported_types());
}

uint64_t ggml_row_bytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info(t);
  MOE_CHECK(n >= 0 && n % info.block_size == 0, "a row of {} {} weights: expected a multiple of the block size {}", n,
            info.name, info.block_size);
  return static_cast<uint64_t>(n / info.block_size) * info.block_bytes;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  check_row(t, n, "dequantize_row");
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_at(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(le16(p + 2 * i));
      return;
    default:
      break;
  }
  const GgmlTypeInfo& info = ggml_type_info(t);
  const Format f = format_of(t);
  Block blk;
  for (int64_t b = 0; b < n / info.block_size; ++b) {
    unpack(t, p + b * info.block_bytes, &blk);
    float* y = dst + b * info.block_size;
    for (int64_t j = 0; j < info.block_size; ++j) {
      const int g = static_cast<int>(j / f.group_size);
      const int q = blk.q[j];
      // Each line is ggml's expression for the type, with its operand order. Every
      // product here is exact (see decompose_row), so each weight rounds once at most
      // and an FMA contraction could not change the bits.
      switch (f.form) {
        case Form::Symmetric: y[j] = static_cast<float>(q - f.zero) * blk.d[g]; break;
        case Form::MinusMin: y[j] = blk.d[g] * static_cast<float>(q) - blk.m[g]; break;
        case Form::PlusMin: y[j] = blk.d[g] * static_cast<float>(q) + blk.m[g]; break;
      }
    }
  }
}

std::optional<GroupLayout> group_layout(GgmlType t) {
  if (!integer_coded(t)) return std::nullopt;
  const Format f = format_of(t);
  return GroupLayout{f.group_size, f.bits, f.form == Form::Symmetric ? f.zero : -1};
}

// Why scale * q - offset is the reference value (finite f16 d, dmin, m throughout):
//   MinusMin (Q4_K, Q5_K): scale = d*sc and offset = dmin*m are ggml's d1 and m1, and
//     the two operations are ggml's own, in its order: the same bits by construction.
//     (d*sc: 11 significant bits times 6 is exact; times q < 32 stays under 24 bits, so
//     only the difference rounds, and fusing it into an FMA would change nothing.)
//   PlusMin (Q4_1, Q5_1): offset = -m (negation is exact) and x - (-m) is by IEEE 754
//     definition x + m: the same bits, signed zeros included (d * q is exact here too).
//   Symmetric (Q4_0, Q5_0, Q8_0, Q6_K): scale = d (Q6_K: d * sc, an 11-bit f16
//     significand times an integer of at most 7 bits, so exact) has at most 18
//     significant bits; q < 256 adds at most 8, so scale * q (<= 24 bits) is exact;
//     offset = zero * scale is exact (zero is a power of two); their difference
//     scale * (q - zero) fits the same bound, so the subtraction is exact too. The
//     reference float(q - zero) * d is exact by the same count. Both are the exact real
//     number, hence the same float, except that x - x is +0 while the reference's
//     0 * d is -0 for a negative d. (All of this for finite d: f16 d is at least 2^-24
//     when non-zero, so nothing underflows, and at most 65504 * 128 * 255, so nothing
//     overflows.)
void decompose_row(GgmlType t, const void* src, int64_t n, const RowGroups& out) {
  MOE_CHECK(integer_coded(t), "decompose_row: type {} has no integer codes (expected one of Q4_0, Q4_1, Q5_0, "
            "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", ggml_type_name(t));
  check_row(t, n, "decompose_row");
  const GgmlTypeInfo& info = ggml_type_info(t);
  const Format f = format_of(t);
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t groups_per_block = info.block_size / f.group_size;
  Block blk;
  for (int64_t b = 0; b < n / info.block_size; ++b) {
    blk.q = out.q + b * info.block_size;
    unpack(t, p + b * info.block_bytes, &blk);
    for (int64_t g = 0; g < groups_per_block; ++g) {
      const float d = blk.d[g];
      float off = 0.0f;
      switch (f.form) {
        case Form::Symmetric: off = static_cast<float>(f.zero) * d; break;
        case Form::MinusMin: off = blk.m[g]; break;
        case Form::PlusMin: off = -blk.m[g]; break;
      }
      out.scale[b * groups_per_block + g] = d;
      out.offset[b * groups_per_block + g] = off;
    }
  }
}

std::optional<int> superblock_groups(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: return 8;
    case GgmlType::Q6_K: return 16;
    default: return std::nullopt;
  }
}

// The factors unpack_k45 / unpack_q6_k read, per block: decompose_row's scale is
// f16(d) * sc and its offset f16(dmin) * mn (Q6_K: offset zero * scale, no mins).
void decompose_row_sb(GgmlType t, const void* src, int64_t n, const RowSuperBlocks& out) {
  MOE_CHECK(superblock_groups(t).has_value(), "decompose_row_sb: type {} has no super-blocks (expected Q4_K, Q5_K "
            "or Q6_K)", ggml_type_name(t));
  check_row(t, n, "decompose_row_sb");
  const GgmlTypeInfo& info = ggml_type_info(t);
  const int64_t gps = *superblock_groups(t);
  const auto* p = static_cast<const uint8_t*>(src);
  Block blk;
  for (int64_t b = 0; b < n / info.block_size; ++b) {
    blk.q = out.q + b * info.block_size;
    unpack(t, p + b * info.block_bytes, &blk);
    out.d[b] = blk.d_bits;
    if (out.m) out.m[b] = blk.m_bits;
    for (int64_t g = 0; g < gps; ++g) {
      out.sc[b * gps + g] = blk.sc[g];
      if (out.mn) out.mn[b * gps + g] = blk.mn[g];
    }
  }
}

}  // namespace moe::gguf
