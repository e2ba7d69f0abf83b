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

// Rows of a slice decomposed per chunk: 24 rows of a 2048-wide expert are 48 KiB of
// codes, so the chunk stays in L2 between decomposition and packing, and a load
// allocates no slice-sized buffers (perf: fresh pages cost a load as much as the packing,
// and stacking gate and up copied every code once more). Not a power of two, so the
// fixtures' row counts (64, 128, 256) end in a short chunk, which their tests then cover.
constexpr int64_t kChunkRows = 24;

// Calls sink(rows, row0) for the consecutive chunks of this rank's slice of r,
// decomposed into format f: rows is a CodedWeight of at most kChunkRows rows (plain
// form: codes, per f.group scales and zero points or offsets; super-block form: codes,
// per block D (M), per group sc (mn)), holding rows [row0, row0 + rows) of the slice.
template <class Sink>
void stream_coded(const Checkpoint& ck, const TensorRead& r, const CodedFormat& f, Sink&& sink) {
  const TensorInfo& info = ck.info(r.key);
  MOE_CHECK(info.shape == r.shape, "tensor '{}' in {} has shape {}, expected {}", r.key, ck.file_of(r.key),
            shape_str(info.shape), shape_str(r.shape));
  const GgmlType t = type_of(ck, r);
  const GroupLayout lay = *group_layout(t);
  const ShardPlan p = plan_shard(r);
  MOE_CHECK(p.out_shape.size() == 2 && p.out_shape[1] % f.group == 0, "tensor '{}' in {}: this rank's slice {} has "
            "rows that groups of {} weights do not divide", r.key, ck.file_of(r.key), shape_str(p.out_shape), f.group);
  const int64_t n = p.out_shape[0], k = p.out_shape[1], cols = info.shape.back(), ng = k / f.group;
  const bool super = f.sb_groups > 1;  // the K-quants' own factors (common_format)
  constexpr int64_t kBlock = 256;      // weights per K-quant super-block
  if (super)
    MOE_CHECK(lay.group_size == f.group && superblock_groups(t) == f.sb_groups,
              "tensor '{}' in {}: {} does not have super-blocks of {} groups of {}", r.key, ck.file_of(r.key),
              ggml_type_name(t), f.sb_groups, f.group);
  const int64_t nsb = super ? k / kBlock : ng;  // the plain forms: one "super-block" a group
  const int64_t cr = std::min(n, kChunkRows);
  CodedWeight w;
  w.u = Tensor::empty({cr, k}, DType::U8);
  if (f.sb_groups > 0) {
    w.sb_d = Tensor::empty({cr, nsb}, DType::F16);
    if (f.offsets) w.sb_m = Tensor::empty({cr, nsb}, DType::F16);
  }
  if (super) {
    w.sc = Tensor::empty({cr, ng}, DType::I8);
    if (f.offsets) w.mn = Tensor::empty({cr, ng}, DType::U8);
  }
  if (f.sb_groups <= 1) {  // f32 per group (the f16 form converts them per piece)
    w.scale = Tensor::empty({cr, ng}, DType::F32);
    if (f.offsets) w.offset = Tensor::empty({cr, ng}, DType::F32);
  }
  if (!f.offsets) {
    w.zero = Tensor::empty({cr, ng}, DType::U8);
    std::memset(w.zero.raw(), lay.zero, w.zero.nbytes());  // zero form: every read symmetric (common_format)
  }
  const Tensor raw = ck.view_raw(r.key);
  const GgmlTypeInfo& ti = ggml_type_info(t);
  const uint64_t row_bytes = ggml_row_bytes(t, cols);
  std::vector<uint8_t> q;
  std::vector<float> bs, bo;
  int64_t at = 0;  // elements of the slice done
  auto flush = [&](int64_t rows, int64_t row0) {
    CodedWeight v;
    for (auto [dst, src] : {std::pair{&v.u, &w.u}, {&v.zero, &w.zero}, {&v.offset, &w.offset},
                            {&v.sb_d, &w.sb_d}, {&v.sb_m, &w.sb_m}, {&v.sc, &w.sc}, {&v.mn, &w.mn}})
      if (src->defined()) *dst = rows == cr ? *src : src->slice_rows(0, rows);
    if (f.sb_groups == 0) v.scale = rows == cr ? w.scale : w.scale.slice_rows(0, rows);
    if (f.sb_groups == 1) v.offset = Tensor();  // the f16 form's f32 scratch: sb_d and sb_m hold them
    sink(v, row0);
  };
  // One piece: columns [col, col + len) of a source row, which are columns [c, c + len)
  // of row `row` of the slice.
  auto piece = [&](int64_t b, int64_t len) {
    const int64_t row = at / k, c = at % k, rc = row % cr, col = b % cols;
    MOE_CHECK(c + len <= k, "tensor '{}' in {}: a piece of this rank's slice crosses a row", r.key, ck.file_of(r.key));
    const uint8_t* src_row = raw.data<uint8_t>() + (b / cols) * row_bytes;
    uint8_t* u = w.u.data<uint8_t>() + rc * k + c;
    if (super) {
      MOE_CHECK(col % kBlock == 0 && len % kBlock == 0, "tensor '{}' in {}: this rank's slice cuts a {} block "
                "(columns [{}, {}) of a row)", r.key, ck.file_of(r.key), ggml_type_name(t), col, col + len);
      decompose_row_sb(t, src_row + col / kBlock * ti.block_bytes, len,
                       {u, w.sb_d.data<uint16_t>() + rc * nsb + c / kBlock,
                        f.offsets ? w.sb_m.data<uint16_t>() + rc * nsb + c / kBlock : nullptr,
                        w.sc.data<int8_t>() + rc * ng + c / f.group,
                        f.offsets ? w.mn.data<uint8_t>() + rc * ng + c / f.group : nullptr});
    } else {
      MOE_CHECK(col % f.group == 0 && len % f.group == 0, "tensor '{}' in {}: this rank's slice cuts a group of {} "
                "weights (columns [{}, {}) of a row); MoE-TP must slice on group boundaries", r.key, ck.file_of(r.key),
                f.group, col, col + len);
      // The type's blocks that hold the piece (a K-quant block is 256 weights; MoE-TP
      // slices need only start on a group).
      const int64_t b0 = col / ti.block_size * ti.block_size;
      const int64_t b1 = (col + len + ti.block_size - 1) / ti.block_size * ti.block_size;
      const bool whole = b0 == col && b1 == col + len && f.group == lay.group_size;
      q.resize(whole ? 0 : static_cast<size_t>(b1 - b0));
      bs.resize(static_cast<size_t>((b1 - b0) / lay.group_size));
      bo.resize(bs.size());
      decompose_row(t, src_row + b0 / ti.block_size * ti.block_bytes, b1 - b0,
                    {whole ? u : q.data(), bs.data(), bo.data()});
      if (!whole) std::memcpy(u, q.data() + (col - b0), static_cast<size_t>(len));
      float* sc = w.scale.data<float>() + rc * ng + c / f.group;
      float* off = f.offsets ? w.offset.data<float>() + rc * ng + c / f.group : nullptr;
      for (int64_t G = 0; G < len / f.group; ++G) {
        const int64_t sg = (col - b0 + G * f.group) / lay.group_size;  // the type's group holding this one
        const float s = bs[sg], o = bo[sg];
        MOE_CHECK(std::isfinite(s) && std::isfinite(o), "tensor '{}' in {}: {} block {} of row {} has scale {} and "
                  "min {}, expected finite numbers", r.key, ck.file_of(r.key), ggml_type_name(t),
                  (col + G * f.group) / ti.block_size, b / cols, s, o);
        sc[G] = s;
        if (off) off[G] = o;
      }
      if (f.sb_groups == 1) {  // the per-group d (and -m) are f16 values: held as f16
        auto to_f16 = [&](const float* v, uint16_t* h, const char* what) {
          for (int64_t G = 0; G < len / f.group; ++G) {
            h[G] = f32_to_f16(v[G]);
            MOE_CHECK(f16_to_f32(h[G]) == v[G], "tensor '{}' in {}: {} {} of group {} is not an f16 value", r.key,
                      ck.file_of(r.key), what, v[G], row * ng + c / f.group + G);
          }
        };
        to_f16(sc, w.sb_d.data<uint16_t>() + rc * ng + c / f.group, "scale");
        if (off) to_f16(off, w.sb_m.data<uint16_t>() + rc * ng + c / f.group, "offset");
      }
    }
    at += len;
    if (at % k == 0 && (rc == cr - 1 || at == n * k)) flush(rc + 1, row - rc);
  };
  for_each_row_piece(p, cols, piece);
  MOE_CHECK(at == n * k, "tensor '{}' in {}: this rank's read plan covers {} of its slice's {} weights", r.key,
            ck.file_of(r.key), at, n * k);
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
  // w13's rows are gate's, then up's (make_packed_experts_coded(gated)).
  MOE_CHECK(w13.n % 2 == 0, "expert {}: the gated matrix has {} rows, expected gate's and up's", e, w13.n);
  stream_coded(ck, gate, f13, [&](const CodedWeight& rows, int64_t row0) { pack_expert_coded(w13, e, rows, row0); });
  stream_coded(ck, up, f13,
               [&](const CodedWeight& rows, int64_t row0) { pack_expert_coded(w13, e, rows, w13.n / 2 + row0); });
  pack_matrix(ck, w2, e, down);
}

void pack_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r) {
  stream_coded(ck, r, coded_format(w),
               [&](const CodedWeight& rows, int64_t row0) { pack_expert_coded(w, e, rows, row0); });
}

}  // namespace moe::gguf
