// The KV cache of a whole model, allocated once up front, in blocks (paged).
//
// Storage per layer: two f32 pools of n_blocks blocks of block_size positions,
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
// Not thread-safe for table changes; concurrent writes to distinct (slot, pos) are fine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace moe {

struct KvCacheShape {
  int64_t n_layers = 0, n_slots = 1, max_seq = 0, a_dim = 0, b_dim = 0;
  // 16 positions: small enough that a short request wastes little, large enough that
  // the table lookup per position is noise next to the head_dim-long dot products.
  int64_t block_size = 16;
  int64_t n_blocks = 0;  // 0: dense (n_slots * blocks per slot); > 0: paged pool
  bool paged() const { return n_blocks > 0; }
  int64_t blocks_per_slot() const { return (max_seq + block_size - 1) / block_size; }
  int64_t total_blocks() const { return paged() ? n_blocks : n_slots * blocks_per_slot(); }
  uint64_t bytes() const {
    return static_cast<uint64_t>(n_layers) * total_blocks() * block_size * (a_dim + b_dim) * sizeof(float);
  }
  static uint64_t bytes_per_block(int64_t n_layers, int64_t block_size, int64_t a_dim, int64_t b_dim) {
    return static_cast<uint64_t>(n_layers) * block_size * (a_dim + b_dim) * sizeof(float);
  }
};

class KvCache {
 public:
  KvCache() = default;
  explicit KvCache(const KvCacheShape& s) : s_(s) {
    MOE_CHECK(s.block_size >= 1 && s.n_slots >= 1 && s.max_seq >= 1, "internal: bad KV cache shape");
    const int64_t nb = s.total_blocks();
    for (int64_t l = 0; l < s.n_layers; ++l) {
      a_.push_back(Tensor::zeros({nb, s.block_size, s.a_dim}, DType::F32));
      b_.push_back(Tensor::zeros({nb, s.block_size, s.b_dim}, DType::F32));
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

  float* a(int64_t layer, int64_t slot, int64_t pos) { return a_[layer].data<float>() + row(slot, pos) * s_.a_dim; }
  float* b(int64_t layer, int64_t slot, int64_t pos) { return b_[layer].data<float>() + row(slot, pos) * s_.b_dim; }

 private:
  int64_t row(int64_t slot, int64_t pos) const {
    return static_cast<int64_t>(tables_[slot][pos / s_.block_size]) * s_.block_size + pos % s_.block_size;
  }
  KvCacheShape s_;
  std::vector<Tensor> a_, b_;                // per layer f32 [total_blocks, block_size, dim]
  std::vector<std::vector<int32_t>> tables_;  // [n_slots][blocks of the slot]
};

}  // namespace moe
