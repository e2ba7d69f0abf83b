#include "loader/shard.h"

#include <fmt/format.h>

#include <cstring>

#include "core/check.h"

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
  if (kind == ShardKind::Replicated || kind == ShardKind::RowBias) return shard_kind_name(kind);
  std::string s = fmt::format("{}(", shard_kind_name(kind));
  if (kind == ShardKind::ExpertLocal && expert_end >= 0) s += fmt::format("experts [{}, {}), ", expert_begin, expert_end);
  s += fmt::format("dim {}", dim);
  if (parts > 1) s += fmt::format(" x{}", parts);
  return s + ")";
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
    if (!w.empty() && key.find(w) != std::string::npos) return ShardRule::replicated();
  return rule;
}

uint64_t ShardPlan::elems_read() const {
  uint64_t n = 0;
  for (const auto& [b, e] : ranges) n += static_cast<uint64_t>(e - b);
  return n;
}

namespace {
constexpr uint64_t kSmallPiece = 64 << 10;
}

std::vector<std::pair<int64_t, int64_t>> ShardPlan::views(size_t es) const {
  if (ranges.size() <= 1) return ranges;
  const uint64_t piece_bytes = static_cast<uint64_t>(ranges[0].second - ranges[0].first) * es;
  if (piece_bytes < kSmallPiece) return {{ranges.front().first, ranges.back().second}};
  return ranges;
}

uint64_t ShardPlan::bytes_viewed(size_t es) const {
  uint64_t n = 0;
  for (const auto& [b, e] : views(es)) n += static_cast<uint64_t>(e - b) * es;
  return n;
}

ShardPlan plan_shard(const std::string& key, const Shape& full, const ShardRule& rule, int rank, int size) {
  ShardPlan p;
  int64_t numel = 1;
  for (int64_t d : full) numel *= d;
  if (rule.kind == ShardKind::Replicated || (size == 1 && rule.kind != ShardKind::ExpertLocal)) {
    p.out_shape = full;
    if (numel > 0) p.ranges.push_back({0, numel});
    p.contiguous_out = true;
    return p;
  }
  if (rule.kind == ShardKind::RowBias) {
    p.out_shape = full;
    if (rank == 0) {
      if (numel > 0) p.ranges.push_back({0, numel});
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
  const int parts = rule.parts;
  MOE_CHECK(parts >= 1 && inner[dim] % parts == 0, "tensor '{}' of shape {}: dim {} ({}) is not {} equal blocks", key,
            shape_str(full), dim, inner[dim], parts);
  const int64_t block = inner[dim] / parts;
  const auto [s0, s1] = shard_range(fmt::format("tensor '{}' ({} {}, dim {})", key, rule.describe(), shape_str(full), dim),
                                    block, rank, size);
  int64_t outer = 1, after = 1;
  for (int d = 0; d < dim; ++d) outer *= inner[d];
  for (int d = dim + 1; d < ni; ++d) after *= inner[d];
  const int64_t expert_elems = numel / std::max<int64_t>(1, stacked ? full[0] : 1);
  p.out_shape = inner;
  p.out_shape[dim] = (s1 - s0) * parts;
  if (stacked) p.out_shape.insert(p.out_shape.begin(), e1 - e0);
  for (int64_t e = e0; e < e1; ++e)
    for (int64_t o = 0; o < outer; ++o)
      for (int q = 0; q < parts; ++q) {
        const int64_t base = (stacked ? e * expert_elems : 0) + o * inner[dim] * after + (q * block + s0) * after;
        const int64_t len = (s1 - s0) * after;
        if (len == 0) continue;
        if (!p.ranges.empty() && p.ranges.back().second == base)
          p.ranges.back().second += len;  // adjacent pieces merge
        else
          p.ranges.push_back({base, base + len});
      }
  int64_t out_numel = 1;
  for (int64_t d : p.out_shape) out_numel *= d;
  p.contiguous_out = p.ranges.size() == 1 || (p.ranges.empty() && out_numel == 0);
  return p;
}

void prefetch_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                      int rank, int size) {
  if (!ck.has(key)) return;
  const TensorInfo& info = ck.info(key);
  if (info.shape != full_shape) return;
  const ShardPlan p = plan_shard(key, full_shape, rule, rank, size);
  for (const auto& [b, e] : p.views(dtype_size(info.dtype))) ck.prefetch_elems(key, b, e - b);
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
  // An explicit `out` always gives an owned copy; otherwise views stay views.
  auto convert = [&](Tensor t) { return out ? t.to(dst) : t; };
  if (p.zero_fill) return Tensor::zeros(p.out_shape, dst);
  if (p.contiguous_out) {
    if (p.ranges.empty()) return Tensor::zeros(p.out_shape, dst);
    return convert(ck.view_elems(key, p.ranges[0].first, p.out_shape));
  }
  // Strided: copy the pieces into one buffer, through the views plan.views() names
  // (one view of the whole span when the pieces are small).
  const size_t es = dtype_size(src);
  Tensor buf = Tensor::empty(p.out_shape, src);
  char* dstp = static_cast<char*>(buf.raw());
  size_t next = 0;
  for (const auto& [vb, ve] : p.views(es)) {
    const Tensor v = ck.view_elems(key, vb, {ve - vb});
    const char* base = static_cast<const char*>(v.raw());
    for (; next < p.ranges.size() && p.ranges[next].second <= ve; ++next) {
      const auto [b, e] = p.ranges[next];
      std::memcpy(dstp, base + (b - vb) * es, (e - b) * es);
      dstp += (e - b) * es;
    }
  }
  return convert(buf);
}

}  // namespace moe
