// The KV cache of a whole model, allocated once up front, in blocks (paged).
//
// Storage per layer: two pools of n_blocks blocks of block_size positions, in the
// shape's dtype (KvCacheShape::dtype: f32, or bf16 at half the bytes),
//   GQA: A = K and B = V, dim = n_kv_heads_local * head_dim (after k-norm and RoPE).
//   MLA: A = c_kv, the compressed latent after kv_a_layernorm (dim kv_lora_rank), and
//        B = k_pe, the shared rotary key after RoPE (dim qk_rope_head_dim). Full K and
//        V are never stored: attention runs in the latent space (model/attention.h).
// Each of the n_slots sequence slots has a block table: position p of slot s lives in
// block table[s][p / block_size], row p % block_size. Two ways to fill the tables:
//   dense (the default): slot s owns blocks [s * bps, (s + 1) * bps), bps = max_seq /
//     block_size rounded up - one fixed region per sequence, as `generate` needs;
//   paged (serve): the tables start empty and the owner (the scheduler) hands blocks
//     to slots with set_blocks(); any free block serves any sequence, so memory follows
//     the tokens actually held, not max_seq per slot.
// Rows go in through put_a/put_b (f32 in, rounded to the dtype) and come out widened
// to f32 (row_a/row_b, exact), or raw (a_row/b_row, a_block) for the kernels that widen
// as they go: every reader sees the same f32 values, so KV-cached decode still equals
// recomputing the prefix bit for bit, for either dtype.
// Plane A may be tiled (KvCacheShape::a_tiled, GQA's K): inside a block, column c of
// position p sits at c * block_size + p % block_size, so the attention kernel reads 16
// consecutive positions of one column as one vector load instead of transposing every
// key it scores (model/attention_kernels.h).
// Plane B may be head-major (KvCacheShape::b_heads > 1, GQA's V): inside a block, the
// b_dim / b_heads values of head h at position p sit at (h * block_size + p % block_size)
// * (b_dim / b_heads), so one KV head's V rows of a block are one contiguous run (4 KiB
// for 16 positions of head_dim 128 in bf16) that the hardware prefetchers stream, where
// row-major V gave the attention kernel 256 bytes out of every 1 KiB (Qwen3-30B-A3B: 4
// KV heads) and left it waiting on memory.
// Not thread-safe for table changes; concurrent writes to distinct (slot, pos) are fine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace moe {

struct KvCacheShape {
  int64_t n_layers = 0, n_slots = 1, max_seq = 0, a_dim = 0, b_dim = 0;
  // 16 positions: small enough that a short request wastes little, large enough that
  // the table lookup per position is noise next to the head_dim-long dot products.
  int64_t block_size = 16;
  int64_t n_blocks = 0;  // 0: dense (n_slots * blocks per slot); > 0: paged pool
  // F32 (the default): the cache holds exactly what the projections computed; the
  // fp32 goldens (logits within 1e-4 of transformers) are checked with it.
  // BF16: each value rounded to the nearest bf16 (ties to even, core/dtype.h
  // f32_to_bf16) when stored, widened exactly when read: half the bytes to hold and
  // to read per decode step, at a relative error of at most 2^-9 per K/V value.
  DType dtype = DType::F32;
  // Plane A stored position-minor inside each block (GQA's K; see the header comment).
  // The same bytes, another order: only the readers' addressing changes.
  bool a_tiled = false;
  // Plane B stored head-major inside each block in b_heads runs (GQA's V: its local KV
  // heads; see the header comment). 1: rows. The same bytes, another order.
  int64_t b_heads = 1;
  bool paged() const { return n_blocks > 0; }
  int64_t blocks_per_slot() const { return (max_seq + block_size - 1) / block_size; }
  int64_t total_blocks() const { return paged() ? n_blocks : n_slots * blocks_per_slot(); }
  uint64_t bytes() const {
    return static_cast<uint64_t>(total_blocks()) * bytes_per_block(n_layers, block_size, a_dim, b_dim, dtype);
  }
  static uint64_t bytes_per_block(int64_t n_layers, int64_t block_size, int64_t a_dim, int64_t b_dim, DType dtype) {
    return static_cast<uint64_t>(n_layers) * block_size * (a_dim + b_dim) * dtype_size(dtype);
  }
};

// A stored element as f32, for readers of a_row/b_row: exact for both dtypes (bf16 is
// the top half of an f32), so every reader sees the values row_a/row_b return.
inline float kv_widen(float x) { return x; }
inline float kv_widen(uint16_t h) { return bf16_to_f32(h); }

// The dtypes a KV cache can hold, by the names of --kv-cache-dtype.
inline DType parse_kv_cache_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  MOE_FAIL("KV cache dtype '{}' is not supported: expected f32 or bf16", name);
}

class KvCache {
 public:
  KvCache() = default;
  explicit KvCache(const KvCacheShape& s) : s_(s) {
    MOE_CHECK(s.block_size >= 1 && s.n_slots >= 1 && s.max_seq >= 1, "internal: bad KV cache shape");
    MOE_CHECK(s.b_heads >= 1 && s.b_dim % s.b_heads == 0, "internal: KV plane B of {} values in {} heads", s.b_dim,
              s.b_heads);
    MOE_CHECK(s.dtype == DType::F32 || s.dtype == DType::BF16, "KV cache dtype {} is not supported (f32 or bf16)",
              dtype_name(s.dtype));
    const int64_t nb = s.total_blocks();
    for (int64_t l = 0; l < s.n_layers; ++l) {
      a_.push_back(Tensor::zeros({nb, s.block_size, s.a_dim}, s.dtype));
      b_.push_back(Tensor::zeros({nb, s.block_size, s.b_dim}, s.dtype));
    }
    tables_.assign(s.n_slots, {});
    if (!s.paged()) {
      const int64_t bps = s.blocks_per_slot();
      for (int64_t slot = 0; slot < s.n_slots; ++slot)
        for (int64_t j = 0; j < bps; ++j) tables_[slot].push_back(static_cast<int32_t>(slot * bps + j));
    }
  }

  const KvCacheShape& shape() const { return s_; }
  int64_t n_slots() const { return s_.n_slots; }
  int64_t max_seq() const { return s_.max_seq; }
  int64_t a_dim() const { return s_.a_dim; }
  int64_t b_dim() const { return s_.b_dim; }
  int64_t block_size() const { return s_.block_size; }
  // Positions slot `slot` can hold now (its blocks x block_size, at most max_seq).
  int64_t capacity(int64_t slot) const {
    return std::min<int64_t>(s_.max_seq, static_cast<int64_t>(tables_[slot].size()) * s_.block_size);
  }
  // Paged mode: the blocks of `slot`, in position order (replaces its table).
  void set_blocks(int64_t slot, std::vector<int32_t> blocks) {
    MOE_CHECK(s_.paged(), "internal: set_blocks on a dense KV cache");
    MOE_CHECK(slot >= 0 && slot < s_.n_slots, "KV cache slot {} out of range (n_slots {})", slot, s_.n_slots);
    for (int32_t b : blocks)
      MOE_CHECK(b >= 0 && b < s_.n_blocks, "KV block {} out of range (n_blocks {})", b, s_.n_blocks);
    tables_[slot] = std::move(blocks);
  }
  const std::vector<int32_t>& blocks(int64_t slot) const { return tables_[slot]; }

  DType dtype() const { return s_.dtype; }

  // Stores a row of a_dim (b_dim) f32 values at (slot, pos), rounded to the dtype.
  void put_a(int64_t layer, int64_t slot, int64_t pos, const float* src) {
    if (s_.a_tiled) put_tiled(a_[layer], s_.a_dim, slot, pos, src);
    else put(a_[layer], s_.a_dim, slot, pos, src);
  }
  void put_b(int64_t layer, int64_t slot, int64_t pos, const float* src) {
    if (s_.b_heads > 1) put_heads(b_[layer], slot, pos, src);
    else put(b_[layer], s_.b_dim, slot, pos, src);
  }
  // The row at (slot, pos) as f32: the stored row itself for an f32 cache whose plane
  // holds rows, else widened or gathered into buf (a_dim / b_dim floats) and buf returned.
  const float* row_a(int64_t layer, int64_t slot, int64_t pos, float* buf) const {
    if (s_.a_tiled) return get_tiled(a_[layer], s_.a_dim, slot, pos, buf);
    return get(a_[layer], s_.a_dim, slot, pos, buf);
  }
  const float* row_b(int64_t layer, int64_t slot, int64_t pos, float* buf) const {
    if (s_.b_heads > 1) return get_heads(b_[layer], slot, pos, buf);
    return get(b_[layer], s_.b_dim, slot, pos, buf);
  }
  // The stored row itself, for kernels that widen as they read: E is float (F32) or
  // uint16_t holding bf16 bits (BF16); the caller picks E by dtype().
  template <class E>
  const E* a_row(int64_t layer, int64_t slot, int64_t pos) const {
    MOE_DCHECK(sizeof(E) == dtype_size(s_.dtype) && !s_.a_tiled);
    return static_cast<const E*>(a_[layer].raw()) + row(slot, pos) * s_.a_dim;
  }
  template <class E>
  const E* b_row(int64_t layer, int64_t slot, int64_t pos) const {
    MOE_DCHECK(sizeof(E) == dtype_size(s_.dtype) && s_.b_heads == 1);
    return static_cast<const E*>(b_[layer].raw()) + row(slot, pos) * s_.b_dim;
  }
  // Head h's `width` values of (slot, pos) in plane B, raw, for either layout (rows:
  // the h-th run of that width in the row; head-major: width must be b_dim / b_heads).
  // The next position of the same block is b_pos_stride() elements further.
  template <class E>
  const E* b_head(int64_t layer, int64_t slot, int64_t pos, int64_t h, int64_t width) const {
    MOE_DCHECK(sizeof(E) == dtype_size(s_.dtype));
    const E* base = static_cast<const E*>(b_[layer].raw());
    if (s_.b_heads == 1) return base + row(slot, pos) * s_.b_dim + h * width;
    MOE_DCHECK(width == s_.b_dim / s_.b_heads && h >= 0 && h < s_.b_heads);
    return base + head_base(slot, pos, h);
  }
  int64_t b_pos_stride() const { return s_.b_heads > 1 ? s_.b_dim / s_.b_heads : s_.b_dim; }
  // Tiled plane A: the element (pos, column c) is a_block(...)[c * block_size()], i.e.
  // the pointer is to column 0 of pos inside its block.
  template <class E>
  const E* a_block(int64_t layer, int64_t slot, int64_t pos) const {
    MOE_DCHECK(sizeof(E) == dtype_size(s_.dtype) && s_.a_tiled);
    return static_cast<const E*>(a_[layer].raw()) + tiled_base(slot, pos);
  }

 private:
  void put(Tensor& t, int64_t dim, int64_t slot, int64_t pos, const float* src) {
    const int64_t off = row(slot, pos) * dim;
    if (s_.dtype == DType::F32) std::copy(src, src + dim, static_cast<float*>(t.raw()) + off);
    else
      for (int64_t i = 0; i < dim; ++i) static_cast<uint16_t*>(t.raw())[off + i] = f32_to_bf16(src[i]);
  }
  const float* get(const Tensor& t, int64_t dim, int64_t slot, int64_t pos, float* buf) const {
    const int64_t off = row(slot, pos) * dim;
    if (s_.dtype == DType::F32) return static_cast<const float*>(t.raw()) + off;
    const uint16_t* h = static_cast<const uint16_t*>(t.raw()) + off;
    for (int64_t i = 0; i < dim; ++i) buf[i] = bf16_to_f32(h[i]);
    return buf;
  }
  // Tiled plane: element c of (slot, pos) at block * B * dim + c * B + pos % B.
  int64_t tiled_base(int64_t slot, int64_t pos) const {
    const int64_t B = s_.block_size;
    return static_cast<int64_t>(tables_[slot][pos / B]) * B * s_.a_dim + pos % B;
  }
  void put_tiled(Tensor& t, int64_t dim, int64_t slot, int64_t pos, const float* src) {
    const int64_t base = tiled_base(slot, pos), B = s_.block_size;
    if (s_.dtype == DType::F32)
      for (int64_t i = 0; i < dim; ++i) static_cast<float*>(t.raw())[base + i * B] = src[i];
    else
      for (int64_t i = 0; i < dim; ++i) static_cast<uint16_t*>(t.raw())[base + i * B] = f32_to_bf16(src[i]);
  }
  const float* get_tiled(const Tensor& t, int64_t dim, int64_t slot, int64_t pos, float* buf) const {
    const int64_t base = tiled_base(slot, pos), B = s_.block_size;
    if (s_.dtype == DType::F32)
      for (int64_t i = 0; i < dim; ++i) buf[i] = static_cast<const float*>(t.raw())[base + i * B];
    else
      for (int64_t i = 0; i < dim; ++i) buf[i] = bf16_to_f32(static_cast<const uint16_t*>(t.raw())[base + i * B]);
    return buf;
  }
  // Head-major plane: head h of (slot, pos) at (block * b_heads + h) * B * w + (pos % B) * w.
  int64_t head_base(int64_t slot, int64_t pos, int64_t h) const {
    const int64_t B = s_.block_size, w = s_.b_dim / s_.b_heads;
    return ((static_cast<int64_t>(tables_[slot][pos / B]) * s_.b_heads + h) * B + pos % B) * w;
  }
  void put_heads(Tensor& t, int64_t slot, int64_t pos, const float* src) {
    const int64_t w = s_.b_dim / s_.b_heads;
    for (int64_t h = 0; h < s_.b_heads; ++h) {
      const int64_t base = head_base(slot, pos, h);
      if (s_.dtype == DType::F32) std::copy(src + h * w, src + (h + 1) * w, static_cast<float*>(t.raw()) + base);
      else
        for (int64_t i = 0; i < w; ++i) static_cast<uint16_t*>(t.raw())[base + i] = f32_to_bf16(src[h * w + i]);
    }
  }
  const float* get_heads(const Tensor& t, int64_t slot, int64_t pos, float* buf) const {
    const int64_t w = s_.b_dim / s_.b_heads;
    for (int64_t h = 0; h < s_.b_heads; ++h) {
      const int64_t base = head_base(slot, pos, h);
      for (int64_t i = 0; i < w; ++i)
        buf[h * w + i] = s_.dtype == DType::F32 ? static_cast<const float*>(t.raw())[base + i]
                                                : bf16_to_f32(static_cast<const uint16_t*>(t.raw())[base + i]);
    }
    return buf;
  }
  int64_t row(int64_t slot, int64_t pos) const {
    return static_cast<int64_t>(tables_[slot][pos / s_.block_size]) * s_.block_size + pos % s_.block_size;
  }
  KvCacheShape s_;
  std::vector<Tensor> a_, b_;                // per layer [total_blocks, block_size, dim] of dtype
  std::vector<std::vector<int32_t>> tables_;  // [n_slots][blocks of the slot]
};

}  // namespace moe
