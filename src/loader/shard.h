// Sharding rules: which part of a checkpoint tensor one rank holds.
//
// Every parameter the engine loads carries a ShardRule (nano-vllm's weight_loader
// idea): the loader asks load_sharded() for "this tensor, this rule, this rank of
// this many" and gets exactly that rank's slice, reading only the bytes of that slice
// from the mmapped file: a contiguous slice is a zero-copy view, a strided one (the
// input-dim slice of a row-parallel weight, an expert's I slice of down_proj) is
// copied piece by piece.
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
// A window (window_len >= 0) restricts the sliced dim to [window_begin, window_begin +
// window_len) before anything else: one block of a fused tensor whose blocks differ in
// size (k of a fused qkv_proj, [q | k | v] along the output dim). The rank then slices
// the window as it would slice a tensor of that size (and a replicated rule or a group
// of 1 holds the whole window).
//
// A size that the group does not divide evenly is an error naming the tensor.
//
// The replicated whitelist (FastDeploy's v1 loader rule, the seed 002): a parameter
// whose key matches an entry stays whole on every TP rank whatever its rule says.
// moe-ep's MoE block always runs sequence-parallel for its shared experts: every
// strategy (moe/dispatch/) computes them, whole, on the token rows the rank holds (all
// T rows under allreduce and the slot gather, the rank's own share otherwise) and adds
// them without a TP all-reduce. So the shared experts are on the whitelist of every
// MoE layer load (moe_replicated_whitelist), and mlp_layer_reads describes them with
// the tensor-parallel rules they would have otherwise (gate/up column, down row) and
// lets the whitelist decide: see apply_whitelist.
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
  // The sliced dim's window (see above); window_len < 0: the whole dim.
  int64_t window_begin = 0, window_len = -1;

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
  // This rule on the window [begin, begin + len) of its dim.
  ShardRule window(int64_t begin, int64_t len) const {
    ShardRule r = *this;
    r.window_begin = begin;
    r.window_len = len;
    return r;
  }
  bool windowed() const { return window_len >= 0; }

  std::string describe() const;  // "column(dim 0)", "expert-local(experts [2, 4), dim 1 x2)", ...
};

// The slice [start, end) of a dim of size n held by `rank` of `size`; throws naming
// `what` (the tensor) when size does not divide n.
std::pair<int64_t, int64_t> shard_range(const std::string& what, int64_t n, int rank, int size);

// If `key` contains any of the `whitelist` substrings, the rule is replicated (a
// window is kept: the rank holds the whole block, not the whole fused tensor).
ShardRule apply_whitelist(const std::string& key, const ShardRule& rule, const std::vector<std::string>& whitelist);
// The whitelist of a MoE layer's load: the shared experts' key parts of every family
// (Qwen2-MoE ".shared_expert." and ".shared_expert_gate.", DeepSeek / ERNIE
// ".shared_experts."), because the MoE block runs them sequence-parallel (see above).
const std::vector<std::string>& moe_replicated_whitelist();

// One tensor a rank reads: the checkpoint key, its full shape in the checkpoint, the
// rule that slices it and the group the rule slices over (rank `rank` of `size`).
// `layer` (-1: outside the decoder layers) is for messages. Every weight the engine
// loads is described this way first (model/weights.h, loader/moe_weights.h), so that
// `moe-ep inspect` checks and plans from the same list the loaders read.
struct TensorRead {
  std::string key;
  Shape shape;
  ShardRule rule;
  int rank = 0, size = 1;
  int64_t layer = -1;
  bool int8 = false;  // an int8 weight (FastDeploy W8A8): the checks expect i8, not a float type
};
// "key [shape] rule rank/size" (and " int8"): everything a read depends on besides the
// file, e.g. a weights-cache record's key (loader/weights_cache/weights_cache.h).
std::string describe(const TensorRead& r);

// What load_sharded reads for one tensor: the shape of the result and the pieces of
// the source it copies, in order. Pieces come in runs of equal pieces at a constant
// stride (a row-parallel slice is one run of a piece per row), so a plan stays small
// however many rows it covers. Pure arithmetic on the shape: used by load_sharded and
// by the read plan of `inspect`, so the plan is exactly what the loader touches.
struct ShardRun {
  int64_t begin = 0;   // first element of the first piece (flattened source)
  int64_t len = 0;     // elements per piece
  int64_t stride = 0;  // elements from one piece's start to the next
  int64_t count = 0;   // pieces
};
struct ShardPlan {
  Shape out_shape;
  std::vector<ShardRun> runs;  // the result is every piece of every run, in order
  bool zero_fill = false;  // row-parallel bias on a rank > 0: zeros, nothing read
  bool contiguous_out = false;  // the result is one source range (zero-copy)
  uint64_t elems_read() const;
  uint64_t bytes_read(size_t elem_size) const { return elems_read() * elem_size; }
};
ShardPlan plan_shard(const std::string& key, const Shape& full_shape, const ShardRule& rule, int rank, int size);
ShardPlan plan_shard(const TensorRead& r);

// For dim `out_dim` of the slice load_sharded gives (its out_shape), the index in the
// full tensor of each of its positions: e.g. a column-parallel [8, 4] weight on rank 1
// of 2, dim 0 -> {4, 5, 6, 7}; a fused gate_up of two parts, {2, 3, 6, 7}; a stacked
// expert tensor's dim 0 -> its experts' ids. Pure arithmetic, as plan_shard.
std::vector<int64_t> shard_index_map(const std::string& key, const Shape& full_shape, const ShardRule& rule, int rank,
                                     int size, int out_dim);

// The read of the block scales "<key>_scale_inv" (of shape `scale_shape`) that go with
// an FP8 weight read r (loader/fp8_weights.h): the whole tensor, or for a stacked expert
// tensor the rows of r's experts.
TensorRead fp8_scale_read(const TensorRead& r, const Shape& scale_shape);

// The bytes load_sharded(r) reads from `ck` (dtype of the file), plus for an FP8 weight
// its block scales' read (fp8_scale_read); 0 when the tensor is missing or has another
// shape (the loader then reads nothing: it throws).
uint64_t read_bytes(const Checkpoint& ck, const TensorRead& r);

// Starts background reads of what load_sharded(same arguments) will read; call it for
// a batch of tensors before loading them so the disk works ahead of the copies. Runs
// of pieces under 64 KiB are prefetched as their whole span (the OS reads whole pages
// and more anyway). A missing or mis-shaped tensor is skipped (load_sharded reports it).
void prefetch_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                      int rank, int size);
void prefetch_sharded(const Checkpoint& ck, const TensorRead& r);

// Done with what load_sharded(same arguments) reads: the pages of the mapping holding
// only those bytes leave this process (Checkpoint::release_elems; the page cache keeps
// them). Call it once the slice is packed (or copied) into the engine's own memory, so a
// rank does not hold a weight twice; a view of the slice still works afterwards (its
// pages refault from the page cache). A strided run is released as its whole span: the
// other ranks' pieces between this rank's were never needed here. A missing or
// mis-shaped tensor is skipped.
void release_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                     int rank, int size);
void release_sharded(const Checkpoint& ck, const TensorRead& r);

// This rank's slice of `key`, whose checkpoint shape must be `full_shape` (else an
// error naming the key, the file and both shapes). The result is contiguous, in the
// checkpoint dtype, or an owned copy converted to `out` (float types; any dtype when
// equal) when `out` is given. Without `out`, a slice that is one contiguous byte range
// is a zero-copy read-only view of the mapping (clone() it to own or modify it);
// otherwise an owned copy. Only the slice's bytes are touched (Checkpoint::bytes_touched),
// strided slices included: they are copied piece by piece (Checkpoint::copy_strided).
// An owned result (a strided slice, or any slice converted to `out`) releases its source
// pages at once (release_sharded); a view keeps them until the caller releases them.
Tensor load_sharded(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardRule& rule,
                    int rank, int size, std::optional<DType> out = std::nullopt);
Tensor load_sharded(const Checkpoint& ck, const TensorRead& r, std::optional<DType> out = std::nullopt);

}  // namespace moe
