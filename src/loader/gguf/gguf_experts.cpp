#include "loader/gguf/gguf_experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "loader/gguf/gguf_types.h"

namespace moe::gguf {

namespace {

GgmlType type_of(const Checkpoint& ck, const TensorRead& r) { return static_cast<GgmlType>(ck.info(r.key).ggml_type); }

// fn(b, len) for each piece of a rank's slice (flattened element b, len elements), cut
// at row ends: a run's piece may span several whole rows (a contiguous slice is one).
template <class Fn>
void for_each_row_piece(const ShardPlan& p, int64_t cols, Fn&& fn) {
  for (const ShardRun& run : p.runs)
    for (int64_t i = 0; i < run.count; ++i)
      for (int64_t b = run.begin + i * run.stride, end = b + run.len; b < end;) {
        const int64_t len = std::min(end - b, cols - b % cols);
        fn(b, len);
        b += len;
      }
}

// The super-block form (f.sb_groups > 0: every read a K-quant whose slice holds whole
// 256-weight blocks, common_format): codes, and per block D (M), per group sc (mn).
CodedWeight read_superblocks(const Checkpoint& ck, const TensorRead& r, const CodedFormat& f, const ShardPlan& p) {
  const TensorInfo& info = ck.info(r.key);
  const GgmlType t = type_of(ck, r);
  const GroupLayout lay = *group_layout(t);
  constexpr int64_t kBlock = 256;
  MOE_CHECK(lay.group_size == f.group && superblock_groups(t) == f.sb_groups,
            "tensor '{}' in {}: {} does not have super-blocks of {} groups of {}", r.key, ck.file_of(r.key),
            ggml_type_name(t), f.sb_groups, f.group);
  const int64_t n = p.out_shape[0], k = p.out_shape[1], cols = info.shape.back(), ng = k / f.group, nsb = k / kBlock;
  CodedWeight w;
  w.u = Tensor::empty({n, k}, DType::U8);
  w.sb_d = Tensor::empty({n, nsb}, DType::F16);
  w.sc = Tensor::empty({n, ng}, DType::I8);
  if (f.offsets) {
    w.sb_m = Tensor::empty({n, nsb}, DType::F16);
    w.mn = Tensor::empty({n, ng}, DType::U8);
  } else {
    w.zero = Tensor::empty({n, ng}, DType::U8);
    std::memset(w.zero.raw(), lay.zero, w.zero.nbytes());
  }
  const Tensor raw = ck.view_raw(r.key);
  const uint64_t row_bytes = ggml_row_bytes(t, cols), block_bytes = ggml_type_info(t).block_bytes;
  RowSuperBlocks out{w.u.data<uint8_t>(), w.sb_d.data<uint16_t>(), f.offsets ? w.sb_m.data<uint16_t>() : nullptr,
                     w.sc.data<int8_t>(), f.offsets ? w.mn.data<uint8_t>() : nullptr};
  auto piece = [&](int64_t b, int64_t len) {
    const int64_t row = b / cols, col = b % cols;
    MOE_CHECK(col % kBlock == 0 && len % kBlock == 0, "tensor '{}' in {}: this rank's slice cuts a {} block "
              "(columns [{}, {}) of a row)", r.key, ck.file_of(r.key), ggml_type_name(t), col, col + len);
    decompose_row_sb(t, raw.data<uint8_t>() + row * row_bytes + col / kBlock * block_bytes, len, out);
    out.q += len;
    out.d += len / kBlock;
    if (out.m) out.m += len / kBlock;
    out.sc += len / f.group;
    if (out.mn) out.mn += len / f.group;
  };
  for_each_row_piece(p, cols, piece);
  return w;
}

// This rank's slice of a coded tensor in the plain form of format f (CodedWeight: the
// slice's [n, k] codes, per f.group scales and zero points or offsets).
CodedWeight read_coded(const Checkpoint& ck, const TensorRead& r, const CodedFormat& f) {
  const TensorInfo& info = ck.info(r.key);
  MOE_CHECK(info.shape == r.shape, "tensor '{}' in {} has shape {}, expected {}", r.key, ck.file_of(r.key),
            shape_str(info.shape), shape_str(r.shape));
  const GgmlType t = type_of(ck, r);
  const GroupLayout lay = *group_layout(t);
  const ShardPlan p = plan_shard(r);
  MOE_CHECK(p.out_shape.size() == 2 && p.out_shape[1] % f.group == 0, "tensor '{}' in {}: this rank's slice {} has "
            "rows that groups of {} weights do not divide", r.key, ck.file_of(r.key), shape_str(p.out_shape), f.group);
  const int64_t n = p.out_shape[0], k = p.out_shape[1], cols = info.shape.back(), ng = k / f.group;
  if (f.sb_groups > 1) return read_superblocks(ck, r, f, p);
  if (f.sb_groups == 1) {  // the plain form's f32 scales (offsets) are f16 values: held as f16
    CodedFormat plain = f;
    plain.sb_groups = 0;
    CodedWeight w = read_coded(ck, r, plain);
    auto to_f16 = [&](Tensor& t, const char* what) {
      Tensor h = Tensor::empty(t.shape(), DType::F16);
      const float* src = t.data<float>();
      uint16_t* dst = h.data<uint16_t>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i) {
        const float v = src[i];
        dst[i] = f32_to_f16(v);
        MOE_CHECK(f16_to_f32(dst[i]) == v, "tensor '{}' in {}: {} {} of group {} is not an f16 value", r.key,
                  ck.file_of(r.key), what, v, i);
      }
      t = Tensor();
      return h;
    };
    w.sb_d = to_f16(w.scale, "scale");
    if (f.offsets) w.sb_m = to_f16(w.offset, "offset");
    return w;
  }
  CodedWeight w;
  w.u = Tensor::empty({n, k}, DType::U8);
  w.scale = Tensor::empty({n, ng}, DType::F32);
  if (f.offsets) {
    w.offset = Tensor::empty({n, ng}, DType::F32);
  } else {
    w.zero = Tensor::empty({n, ng}, DType::U8);
  }
  const Tensor raw = ck.view_raw(r.key);
  const GgmlTypeInfo& ti = ggml_type_info(t);
  const uint64_t row_bytes = ggml_row_bytes(t, cols);
  uint8_t* u = w.u.data<uint8_t>();
  float* sc = w.scale.data<float>();
  float* off = f.offsets ? w.offset.data<float>() : nullptr;
  uint8_t* z = f.offsets ? nullptr : w.zero.data<uint8_t>();
  std::vector<uint8_t> q;
  std::vector<float> bs, bo;
  // One piece: columns [col, col + len) of a row, decomposed from the blocks that hold it
  // (a K-quant block is 256 weights; MoE-TP slices need only start on a group).
  auto decompose = [&](int64_t b, int64_t len) {
    const int64_t row = b / cols, col = b % cols;
    MOE_CHECK(col % f.group == 0 && len % f.group == 0, "tensor '{}' in {}: this rank's slice cuts a group of {} "
              "weights (columns [{}, {}) of a row); MoE-TP must slice on group boundaries", r.key, ck.file_of(r.key),
              f.group, col, col + len);
    const int64_t b0 = col / ti.block_size * ti.block_size;
    const int64_t b1 = (col + len + ti.block_size - 1) / ti.block_size * ti.block_size;
    q.resize(static_cast<size_t>(b1 - b0));
    bs.resize(static_cast<size_t>((b1 - b0) / lay.group_size));
    bo.resize(bs.size());
    const uint8_t* src = raw.data<uint8_t>() + row * row_bytes + b0 / ti.block_size * ti.block_bytes;
    decompose_row(t, src, b1 - b0, {q.data(), bs.data(), bo.data()});
    std::memcpy(u, q.data() + (col - b0), static_cast<size_t>(len));
    for (int64_t G = 0; G < len / f.group; ++G) {
      const int64_t sg = (col - b0 + G * f.group) / lay.group_size;  // the type's group holding this one
      const float s = bs[sg], o = bo[sg];
      MOE_CHECK(std::isfinite(s) && std::isfinite(o), "tensor '{}' in {}: {} block {} of row {} has scale {} and min "
                "{}, expected finite numbers", r.key, ck.file_of(r.key), ggml_type_name(t),
                (col + G * f.group) / ti.block_size, row, s, o);
      sc[G] = s;
      if (off) {
        off[G] = o;
      } else {
        z[G] = static_cast<uint8_t>(lay.zero);  // zero form: every read is symmetric (common_format)
      }
    }
    u += len;
    sc += len / f.group;
    if (off) off += len / f.group;
    if (z) z += len / f.group;
  };
  for_each_row_piece(p, cols, decompose);
  return w;
}

}  // namespace

bool is_coded(const Checkpoint& ck, const TensorRead& r) {
  if (!ck.has(r.key)) return false;
  const TensorInfo& info = ck.info(r.key);
  return info.ggml_type >= 0 && ggml_type_info(static_cast<uint32_t>(info.ggml_type)) != nullptr &&
         group_layout(static_cast<GgmlType>(info.ggml_type)).has_value();
}

CodedFormat common_format(const Checkpoint& ck, const std::vector<const TensorRead*>& reads) {
  CodedFormat f{32, 4, false};
  std::optional<GgmlType> one;  // the type of every read, if they share one
  bool whole_blocks = true;     // every slice holds whole 256-weight blocks
  for (const TensorRead* r : reads) {
    MOE_CHECK(is_coded(ck, *r), "tensor '{}' is not of a GGUF integer-coded type", r->key);
    const GgmlType t = type_of(ck, *r);
    const GroupLayout lay = *group_layout(t);
    f.group = std::min<int64_t>(f.group, lay.group_size);
    // 4-bit codes in nibbles, 5- and 6-bit ones (Q5_*, Q6_K) in 6 bits, 8-bit ones in bytes.
    f.bits = std::max(f.bits, lay.bits <= 4 ? 4 : lay.bits <= 6 ? 6 : 8);
    if (lay.zero < 0) f.offsets = true;
    one = r == reads.front() || (one && *one == t) ? std::optional(t) : std::nullopt;
    const ShardPlan p = plan_shard(*r);
    whole_blocks = whole_blocks && p.out_shape.size() == 2 && p.out_shape[1] % 256 == 0;
  }
  // K-quants keep their super-block factors (fewer bytes per group) when the reads share
  // the type and this rank's slices do not cut a block; the other types' per-group d (and
  // -m) are f16 values, held as such (one group per super-block) when the reads agree on
  // zero points or offsets.
  if (one && whole_blocks)
    if (const auto gps = superblock_groups(*one)) f.sb_groups = *gps;
  // The symmetric types' zero point is one code per type (Q4_0 8, Q5_0 16, Q8_0 128,
  // Q6_K 32): held once when every read has the same.
  if (!f.offsets) {
    f.zero = group_layout(type_of(ck, *reads.front()))->zero;
    for (const TensorRead* r : reads)
      if (group_layout(type_of(ck, *r))->zero != f.zero) f.zero = -1;
  }
  if (f.sb_groups == 0) {
    bool plain_f16 = true;
    for (const TensorRead* r : reads) {
      const GgmlType t = type_of(ck, *r);
      plain_f16 = plain_f16 && !superblock_groups(t) && (group_layout(t)->zero < 0) == f.offsets;
    }
    if (plain_f16) f.sb_groups = 1;
  }
  return f;
}

uint64_t coded_bytes(const CodedFormat& f, uint64_t n, uint64_t k) {
  const uint64_t groups = n * ((k + f.group - 1) / f.group);
  if (f.sb_groups > 0) {  // per group i8 sc (+ u8 mn, or a u8 zero), per super-block f16 D (+ M)
    const uint64_t sbs = (groups + f.sb_groups - 1) / f.sb_groups;
    const uint64_t factors = f.sb_groups > 1 ? (f.offsets ? 2 : 1) : 0;  // sc (+ mn): none at 1
    return n * k * f.bits / 8 + groups * (factors + (f.offsets || f.zero >= 0 ? 0 : 1)) + sbs * (f.offsets ? 4 : 2);
  }
  return n * k * f.bits / 8 + groups * (4 + (f.offsets ? 4 : f.zero >= 0 ? 0 : 1));
}

void pack_expert(const Checkpoint& ck, PackedExperts& w13, PackedExperts& w2, int64_t e, const TensorRead& gate,
                 const TensorRead& up, const TensorRead& down) {
  const CodedFormat f13 = coded_format(w13);
  const CodedWeight g = read_coded(ck, gate, f13), u = read_coded(ck, up, f13), d = read_coded(ck, down, coded_format(w2));
  auto stack = [](const Tensor& a, const Tensor& b) {
    if (!a.defined()) return Tensor();
    Tensor t = Tensor::empty({a.dim(0) + b.dim(0), a.dim(1)}, a.dtype());
    std::memcpy(t.raw(), a.raw(), a.nbytes());
    std::memcpy(static_cast<char*>(t.raw()) + a.nbytes(), b.raw(), b.nbytes());
    return t;
  };
  pack_expert_coded(w13, e, {stack(g.u, u.u), stack(g.scale, u.scale), stack(g.zero, u.zero),
                             stack(g.offset, u.offset), stack(g.sb_d, u.sb_d), stack(g.sb_m, u.sb_m),
                             stack(g.sc, u.sc), stack(g.mn, u.mn)});
  pack_expert_coded(w2, e, d);
}

void pack_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r) {
  pack_expert_coded(w, e, read_coded(ck, r, coded_format(w)));
}

}  // namespace moe::gguf
