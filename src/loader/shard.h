// Sharding rules: which part of a checkpoint tensor one rank holds.
//
// Every parameter the engine loads carries a ShardRule (nano-vllm's weight_loader
// idea): the loader asks load_sharded() for "this tensor, this rule, this rank of
// this many" and gets exactly that rank's slice, reading only the bytes of that slice
// from the mmapped file where the slice is made of large contiguous pieces.
//
//   replicated        every rank holds the whole tensor (norms, router, embeddings)
//   column-parallel   slice the output dim (dim 0 of an [out, in] weight, a column-
//                     parallel bias): rank r holds [r*n/size, (r+1)*n/size)
//   row-parallel      slice the input dim (dim 1 of [out, in]); its bias (1-D [out])
//                     must be added once, not `size` times: rank 0 holds it and every
//                     other rank gets zeros, so the all-reduce of the partial outputs
//                     adds it exactly once (and exactly: no division by size)
//   expert-local      a routed expert's tensor: only this EP rank's experts are read
//                     (for stacked [E, ...] tensors, rows [expert_begin, expert_end) of
//                     dim 0, remapped to local ids 0..E_l-1), and under MoE-TP only this
//                     rank's slice of the intermediate dim I (`dim`)
//
// `parts` > 1 means the sliced dim is `parts` equal blocks stacked (a fused gate_up
// [2I, H] is 2 blocks of I rows): each block is sliced the same way and the rank's
// pieces are stacked again, so rank r holds [gate_r; up_r].
//
// A size that the group does not divide evenly is an error naming the tensor.
// A replicated whitelist (e.g. the shared experts when the MoE block runs sequence-
// parallel) turns the rule of every matching key into replicated: see apply_whitelist.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "loader/checkpoint.h"

namespace moe {

enum class ShardKind { Replicated, Column, Row, RowBias, ExpertLocal };
const char* shard_kind_name(ShardKind k);

struct ShardRule {
  ShardKind kind = ShardKind::Replicated;
  int dim = 0;    // the dim sliced across ranks (negative: counted from the end)
  int parts = 1;  // the sliced dim is this many equal stacked blocks (fused gate_up: 2)
  // Expert-local stacked tensors only: experts [expert_begin, expert_end) of dim 0
  // (expert_end < 0: not stacked, the key is one expert's own tensor).
  int64_t expert_begin = 0, expert_end = -1;

  static ShardRule replicated() { return {}; }
  static ShardRule column(int dim = 0, int parts = 1) { return {ShardKind::Column, dim, parts}; }
  static ShardRule row(int dim = -1) { return {ShardKind::Row, dim, 1}; }
  static ShardRule row_bias() { return {ShardKind::RowBias, 0, 1}; }
  // One expert's own tensor (per-expert key): slice I (`i_dim`) by MoE-TP.
  static ShardRule expert_local(int i_dim, int parts = 1) { return {ShardKind::ExpertLocal, i_dim, parts}; }
  // A stacked [E, ...] tensor: experts [begin, end) then I (`i_dim`) by MoE-TP.
  static ShardRule expert_local_stacked(int64_t begin, int64_t end, int i_dim, int parts = 1) {
    return {ShardKind::ExpertLocal, i_dim, parts, begin, end};
  }

  std::string describe() const;  // "column(dim 0)", "expert-local(experts [2, 4), dim 1 x2)", ...
};

// The slice [start, end) of a dim of size n held by `rank` of `size`; throws naming
// `what` (the tensor) when size does not divide n.
std::pair<int64_t, int64_t> shard_range(const std::string& what, int64_t n, int rank, int size);

// If `key` contains any of the `whitelist` substrings, the rule is replicated.
ShardRule apply_whitelist(const std::string& key, const ShardRule& rule, const std::vector<std::string>& whitelist);

// What load_sharded will read for one tensor: the shape of the result and the
// element ranges of the source it views (in order, [begin, end) of the flattened
// source tensor). Pure arithmetic on the shape: used by load_sharded and by the read
// plan of `inspect`, so the plan is exactly what the loader touches.
struct ShardPlan {
  Shape out_shape;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // element ranges of the source
  bool zero_fill = false;  // row-parallel bias on a rank > 0: zeros, nothing read
  bool contiguous_out = false;  // the result is exactly one source range (zero-copy)
  uint64_t elems_read() const;
  // The element ranges load_sharded views for a source of `elem_size`-byte elements:
  // `ranges`, or their whole span when the pieces are small (see load_sharded).
  std::vector<std::pair<int64_t, int64_t>> views(size_t elem_size) const;
  uint64_t bytes_viewed(size_t elem_size) const;
};
ShardPlan plan_shard(const std::string& key, const Shape& full_shape, const ShardRule& rule, int rank, int size);

// This rank's slice of `key`, whose checkpoint shape must be `full_shape` (else an
// error naming the key, the file and both shapes). The result is contiguous, in the
// checkpoint dtype, or an owned copy converted to `out` (float types; any dtype when
// equal) when `out` is given. Without `out`, a slice that is one contiguous byte range
// is a zero-copy read-only view of the mapping (clone() it to own or modify it);
// otherwise an owned copy. Only the slice's bytes are viewed (Checkpoint::bytes_touched), except
// that a strided slice made of pieces under 64 KiB views the span from its first to
// its last piece: the OS pages those bytes in anyway.
// Starts background reads of what load_sharded(same arguments) will view; call it for
// a batch of tensors before loading them so the disk works ahead of the copies.
// A missing or mis-shaped tensor is skipped (load_sharded reports it).
void prefetch_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                      int rank, int size);

Tensor load_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                    int rank, int size, std::optional<DType> out = std::nullopt);

}  // namespace moe
