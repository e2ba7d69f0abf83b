#include "loader/shard.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"
#include "loader/gguf/gguf_types.h"
#include "loader/hf_int4/hf_int4.h"

namespace moe {

const char* shard_kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::Replicated: return "replicated";
    case ShardKind::Column: return "column";
    case ShardKind::Row: return "row";
    case ShardKind::RowBias: return "row-bias";
    case ShardKind::ExpertLocal: return "expert-local";
  }
  return "?";
}

std::string ShardRule::describe() const {
  const std::string win = windowed() ? fmt::format(" window [{}, {}) of dim {}", window_begin, window_begin + window_len, dim) : "";
  if (kind == ShardKind::Replicated || kind == ShardKind::RowBias) return shard_kind_name(kind) + win;
  std::string s = fmt::format("{}(", shard_kind_name(kind));
  if (kind == ShardKind::ExpertLocal && expert_end >= 0) s += fmt::format("experts [{}, {}), ", expert_begin, expert_end);
  s += fmt::format("dim {}", dim);
  if (parts > 1) s += fmt::format(" x{}", parts);
  return s + ")" + win;
}

std::pair<int64_t, int64_t> shard_range(const std::string& what, int64_t n, int rank, int size) {
  MOE_CHECK(size >= 1 && rank >= 0 && rank < size, "{}: rank {} of {} is not a valid shard", what, rank, size);
  MOE_CHECK(n % size == 0, "{}: size {} does not split evenly over {} ranks (expected a multiple of {})", what, n,
            size, size);
  const int64_t block = n / size;
  return {rank * block, (rank + 1) * block};
}

ShardRule apply_whitelist(const std::string& key, const ShardRule& rule, const std::vector<std::string>& whitelist) {
  for (const auto& w : whitelist)
    if (!w.empty() && key.find(w) != std::string::npos) {
      ShardRule r = ShardRule::replicated();
      r.dim = rule.dim;
      return rule.windowed() ? r.window(rule.window_begin, rule.window_len) : r;
    }
  return rule;
}

const std::vector<std::string>& moe_replicated_whitelist() {
  static const std::vector<std::string> w = {".shared_expert.", ".shared_expert_gate.", ".shared_experts."};
  return w;
}

uint64_t ShardPlan::elems_read() const {
  uint64_t n = 0;
  for (const ShardRun& r : runs) n += static_cast<uint64_t>(r.len) * static_cast<uint64_t>(r.count);
  return n;
}

namespace {

// Appends the piece [b, b + len) of the source: it extends the last piece when they
// touch, joins the last run when it has that run's length and stride, or starts a run.
void add_piece(std::vector<ShardRun>& runs, int64_t b, int64_t len) {
  if (len == 0) return;
  if (!runs.empty()) {
    ShardRun& r = runs.back();
    const int64_t last = r.begin + (r.count - 1) * r.stride;
    if (r.count == 1 && last + r.len == b) {
      r.len += len;
      return;
    }
    if (len == r.len && (r.count == 1 || b - last == r.stride)) {
      r.stride = b - last;
      ++r.count;
      return;
    }
  }
  runs.push_back({b, len, len, 1});
}

// Below this a piece is not worth its own madvise: prefetch the run's whole span.
constexpr uint64_t kSmallPiece = 64 << 10;

}  // namespace

ShardPlan plan_shard(const std::string& key, const Shape& full, const ShardRule& rule, int rank, int size) {
  ShardPlan p;
  int64_t numel = 1;
  for (int64_t d : full) numel *= d;
  const bool whole = rule.kind == ShardKind::Replicated || (size == 1 && rule.kind != ShardKind::ExpertLocal);
  if (whole && !rule.windowed()) {
    p.out_shape = full;
    add_piece(p.runs, 0, numel);
    p.contiguous_out = true;
    return p;
  }
  if (rule.kind == ShardKind::RowBias && !rule.windowed()) {
    p.out_shape = full;
    if (rank == 0) {
      add_piece(p.runs, 0, numel);
      p.contiguous_out = true;
    } else {
      p.zero_fill = true;
    }
    return p;
  }
  const int nd = static_cast<int>(full.size());
  // Expert restriction of a stacked tensor: dim 0 becomes [expert_begin, expert_end).
  int64_t e0 = 0, e1 = 1;  // a virtual leading "expert" dim of 1 for per-expert tensors
  Shape inner = full;
  const bool stacked = rule.kind == ShardKind::ExpertLocal && rule.expert_end >= 0;
  if (stacked) {
    MOE_CHECK(nd >= 1, "tensor '{}': an expert-local stacked tensor needs an expert dim, got shape {}", key,
              shape_str(full));
    e0 = rule.expert_begin;
    e1 = rule.expert_end;
    MOE_CHECK(0 <= e0 && e0 <= e1 && e1 <= full[0], "tensor '{}' of shape {}: experts [{}, {}) outside [0, {})", key,
              shape_str(full), e0, e1, full[0]);
    inner.erase(inner.begin());
  }
  const int ni = static_cast<int>(inner.size());
  const int dim = rule.dim < 0 ? rule.dim + ni : rule.dim;
  MOE_CHECK(dim >= 0 && dim < ni, "tensor '{}' of shape {}: cannot shard dim {} ({})", key, shape_str(full), rule.dim,
            rule.describe());
  // The window of the sliced dim (the whole dim without one).
  const int64_t wb = rule.windowed() ? rule.window_begin : 0, wn = rule.windowed() ? rule.window_len : inner[dim];
  MOE_CHECK(wb >= 0 && wn >= 0 && wb + wn <= inner[dim], "tensor '{}' of shape {}: window [{}, {}) of dim {} outside [0, {})",
            key, shape_str(full), wb, wb + wn, dim, inner[dim]);
  if (rule.kind == ShardKind::RowBias && rank != 0) {  // windowed row bias: zeros on every rank but 0
    p.out_shape = inner;
    p.out_shape[dim] = wn;
    p.zero_fill = true;
    return p;
  }
  const int parts = rule.parts;
  MOE_CHECK(parts >= 1 && wn % parts == 0, "tensor '{}' of shape {}: dim {} ({}) is not {} equal blocks", key,
            shape_str(full), dim, wn, parts);
  const int64_t block = wn / parts;
  // A replicated (or row-bias) rule on a window, or a group of 1: the whole window.
  const bool one = whole || rule.kind == ShardKind::RowBias;
  const auto [s0, s1] =
      shard_range(fmt::format("tensor '{}' ({} {}, dim {})", key, rule.describe(), shape_str(full), dim), block,
                  one ? 0 : rank, one ? 1 : size);
  int64_t outer = 1, after = 1;
  for (int d = 0; d < dim; ++d) outer *= inner[d];
  for (int d = dim + 1; d < ni; ++d) after *= inner[d];
  const int64_t expert_elems = numel / std::max<int64_t>(1, stacked ? full[0] : 1);
  p.out_shape = inner;
  p.out_shape[dim] = (s1 - s0) * parts;
  if (stacked) p.out_shape.insert(p.out_shape.begin(), e1 - e0);
  for (int64_t e = e0; e < e1; ++e)
    for (int64_t o = 0; o < outer; ++o)
      for (int q = 0; q < parts; ++q)
        add_piece(p.runs, (stacked ? e * expert_elems : 0) + o * inner[dim] * after + (wb + q * block + s0) * after,
                  (s1 - s0) * after);
  p.contiguous_out = p.runs.empty() || (p.runs.size() == 1 && p.runs[0].count == 1);
  return p;
}

std::vector<int64_t> shard_index_map(const std::string& key, const Shape& full, const ShardRule& rule, int rank,
                                     int size, int out_dim) {
  const int nd = static_cast<int>(full.size());
  MOE_CHECK(out_dim >= 0 && out_dim < nd, "tensor '{}' of shape {}: no dim {}", key, shape_str(full), out_dim);
  auto iota = [](int64_t b, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = b + i;
    return v;
  };
  if (rule.windowed()) {
    // A window of a 2-D weight's rows or columns (a vocabulary-parallel lm_head): the
    // window's own slice, shifted to where the window starts.
    const int dim = rule.dim < 0 ? rule.dim + nd : rule.dim;
    MOE_CHECK(rule.kind != ShardKind::ExpertLocal && rule.parts == 1 && dim >= 0 && dim < nd &&
                  rule.window_begin >= 0 && rule.window_begin + rule.window_len <= full[dim],
              "tensor '{}' of shape {}: no index map for the windowed rule {}", key, shape_str(full), rule.describe());
    if (out_dim != dim) return iota(0, full[out_dim]);
    const bool whole = rule.kind == ShardKind::Replicated || rule.kind == ShardKind::RowBias || size == 1;
    const auto [s0, s1] = shard_range(fmt::format("tensor '{}' ({} {}, dim {})", key, rule.describe(), shape_str(full), dim),
                                      rule.window_len, whole ? 0 : rank, whole ? 1 : size);
    return iota(rule.window_begin + s0, s1 - s0);
  }
  if (rule.kind == ShardKind::Replicated || rule.kind == ShardKind::RowBias ||
      (size == 1 && rule.kind != ShardKind::ExpertLocal))
    return iota(0, full[out_dim]);
  const bool stacked = rule.kind == ShardKind::ExpertLocal && rule.expert_end >= 0;
  if (stacked && out_dim == 0) return iota(rule.expert_begin, rule.expert_end - rule.expert_begin);
  const int ni = nd - (stacked ? 1 : 0);
  const int dim = rule.dim < 0 ? rule.dim + ni : rule.dim;  // in the inner (per-expert) shape
  const int idim = out_dim - (stacked ? 1 : 0);
  if (idim != dim) return iota(0, full[out_dim]);
  const int64_t block = full[out_dim] / rule.parts;
  const auto [s0, s1] = shard_range(fmt::format("tensor '{}' ({} {}, dim {})", key, rule.describe(), shape_str(full), dim),
                                    block, rank, size);
  std::vector<int64_t> v;
  for (int q = 0; q < rule.parts; ++q)
    for (int64_t i = s0; i < s1; ++i) v.push_back(q * block + i);
  return v;
}

ShardPlan plan_shard(const TensorRead& r) { return plan_shard(r.key, r.shape, r.rule, r.rank, r.size); }

uint64_t read_bytes(const Checkpoint& ck, const TensorRead& r) {
  if (hf_int4::is_int4_weight(ck, r.key)) {
    // GPTQ / AWQ / compressed-tensors: the slice's share of the module's int4 tensors
    // (codes, zero points, scales), as many bytes per weight as the whole module has.
    uint64_t numel = 1;
    for (int64_t d : r.shape) numel *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    if (numel == 0) return 0;
    const long double share = static_cast<long double>(plan_shard(r).elems_read()) / numel;
    return static_cast<uint64_t>(share * hf_int4::stored_bytes(ck, r.key));
  }
  if (!ck.has(r.key)) return 0;
  const TensorInfo& info = ck.info(r.key);
  if (info.shape != r.shape) return 0;
  uint64_t n = plan_shard(r).bytes_read(dtype_size(info.dtype));
  if (info.quantized()) {  // GGUF blocks: the bytes of the values read, block_bytes per block_size
    const auto& ti = gguf::ggml_type_info(static_cast<gguf::GgmlType>(info.ggml_type));
    n = plan_shard(r).elems_read() / static_cast<uint64_t>(ti.block_size) * ti.block_bytes;
  }
  const std::string skey = r.key + "_scale_inv";
  if (info.dtype == DType::F8E4M3 && ck.has(skey)) {
    const TensorInfo& si = ck.info(skey);
    try {
      n += plan_shard(fp8_scale_read(r, si.shape)).bytes_read(dtype_size(si.dtype));
    } catch (const Error&) {  // a scale tensor the loader rejects: it reads nothing
    }
  }
  return n;
}

TensorRead fp8_scale_read(const TensorRead& r, const Shape& scale_shape) {
  TensorRead s{r.key + "_scale_inv", scale_shape, ShardRule::replicated(), 0, 1, r.layer};
  if (r.rule.kind == ShardKind::ExpertLocal && r.rule.expert_end >= 0)
    s.rule = ShardRule::expert_local_stacked(r.rule.expert_begin, r.rule.expert_end, 0);  // size 1: experts only
  return s;
}

void prefetch_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                      int rank, int size) {
  if (!ck.has(key)) return;
  const TensorInfo& info = ck.info(key);
  if (info.shape != full_shape) return;
  const uint64_t es = dtype_size(info.dtype);
  for (const ShardRun& r : plan_shard(key, full_shape, rule, rank, size).runs) {
    if (static_cast<uint64_t>(r.len) * es < kSmallPiece) {
      ck.prefetch_elems(key, r.begin, (r.count - 1) * r.stride + r.len);
      continue;
    }
    for (int64_t i = 0; i < r.count; ++i) ck.prefetch_elems(key, r.begin + i * r.stride, r.len);
  }
}

void prefetch_sharded(const Checkpoint& ck, const TensorRead& r) {
  prefetch_sharded(ck, r.key, r.shape, r.rule, r.rank, r.size);
}

void release_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                     int rank, int size) {
  if (!ck.has(key)) return;
  const TensorInfo& info = ck.info(key);
  if (info.shape != full_shape) return;
  for (const ShardRun& r : plan_shard(key, full_shape, rule, rank, size).runs)
    ck.release_elems(key, r.begin, (r.count - 1) * r.stride + r.len);
}

void release_sharded(const Checkpoint& ck, const TensorRead& r) {
  release_sharded(ck, r.key, r.shape, r.rule, r.rank, r.size);
}

Tensor load_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                    int rank, int size, std::optional<DType> out) {
  MOE_CHECK(ck.has(key), "tensor '{}' missing from checkpoint {} (expected shape {})", key, ck.dir(),
            shape_str(full_shape));
  const TensorInfo& info = ck.info(key);
  MOE_CHECK(info.shape == full_shape, "tensor '{}' in {} has shape {}, expected {}", key, ck.file_of(key),
            shape_str(info.shape), shape_str(full_shape));
  const ShardPlan p = plan_shard(key, full_shape, rule, rank, size);
  const DType src = info.dtype;
  const DType dst = out.value_or(src);
  auto is_float = [](DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; };
  MOE_CHECK(src == dst || (is_float(src) && is_float(dst)), "tensor '{}' in {} has dtype {}, expected f32, bf16 or f16",
            key, ck.file_of(key), dtype_name(src));
  // An explicit `out` always gives an owned copy; otherwise views stay views.
  auto release = [&] { release_sharded(ck, key, full_shape, rule, rank, size); };
  if (p.zero_fill) return Tensor::zeros(p.out_shape, dst);
  if (p.contiguous_out) {
    if (p.runs.empty()) return Tensor::zeros(p.out_shape, dst);
    Tensor t = ck.view_elems(key, p.runs[0].begin, p.out_shape);
    if (!out) return t;
    t = t.to(dst);
    release();
    return t;
  }
  // Strided: copy the pieces, run by run, into one buffer (already an owned copy).
  Tensor buf = Tensor::empty(p.out_shape, src);
  char* dstp = static_cast<char*>(buf.raw());
  for (const ShardRun& r : p.runs) {
    ck.copy_strided(key, r.begin, r.len, r.stride, r.count, dstp);
    dstp += static_cast<size_t>(r.len * r.count) * dtype_size(src);
  }
  release();
  return dst == src ? buf : buf.to(dst);
}

Tensor load_sharded(const Checkpoint& ck, const TensorRead& r, std::optional<DType> out) {
  return load_sharded(ck, r.key, r.shape, r.rule, r.rank, r.size, out);
}

std::string describe(const TensorRead& r) {
  return fmt::format("{} {} {} {}/{}{}", r.key, shape_str(r.shape), r.rule.describe(), r.rank, r.size,
                     r.int8 ? " int8" : "");
}

}  // namespace moe
