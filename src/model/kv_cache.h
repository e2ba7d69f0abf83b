// The KV cache of a whole model, allocated once up front for n_slots sequences of at
// most max_seq positions (a request that does not fit is refused before any work).
//
// Per layer two f32 planes, each [n_slots, max_seq, dim]:
//   GQA: A = K and B = V, dim = n_kv_heads_local * head_dim (after k-norm and RoPE).
//   MLA: A = c_kv, the compressed latent after kv_a_layernorm (dim kv_lora_rank), and
//        B = k_pe, the shared rotary key after RoPE (dim qk_rope_head_dim). Full K and
//        V are never stored: attention runs in the latent space (model/attention.h).
// Not thread-safe for allocation; concurrent writes to distinct (slot, pos) are fine.
#pragma once

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace moe {

class KvCache {
 public:
  KvCache() = default;
  KvCache(int64_t n_layers, int64_t n_slots, int64_t max_seq, int64_t a_dim, int64_t b_dim)
      : n_slots_(n_slots), max_seq_(max_seq), a_dim_(a_dim), b_dim_(b_dim) {
    for (int64_t l = 0; l < n_layers; ++l) {
      a_.push_back(Tensor::zeros({n_slots, max_seq, a_dim}, DType::F32));
      b_.push_back(Tensor::zeros({n_slots, max_seq, b_dim}, DType::F32));
    }
  }
  static uint64_t bytes_needed(int64_t n_layers, int64_t n_slots, int64_t max_seq, int64_t a_dim, int64_t b_dim) {
    return static_cast<uint64_t>(n_layers) * n_slots * max_seq * (a_dim + b_dim) * sizeof(float);
  }

  int64_t n_slots() const { return n_slots_; }
  int64_t max_seq() const { return max_seq_; }
  int64_t a_dim() const { return a_dim_; }
  int64_t b_dim() const { return b_dim_; }
  float* a(int64_t layer, int64_t slot, int64_t pos) { return a_[layer].data<float>() + (slot * max_seq_ + pos) * a_dim_; }
  float* b(int64_t layer, int64_t slot, int64_t pos) { return b_[layer].data<float>() + (slot * max_seq_ + pos) * b_dim_; }

 private:
  int64_t n_slots_ = 0, max_seq_ = 0, a_dim_ = 0, b_dim_ = 0;
  std::vector<Tensor> a_, b_;  // per layer f32 [n_slots, max_seq, dim]
};

}  // namespace moe
