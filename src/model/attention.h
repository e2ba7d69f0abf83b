// Self-attention of one decoder layer, over the KV cache (model/kv_cache.h).
//
//   GqaAttention: q/k/v projections (optional bias: Qwen2), optional per-head
//     RMSNorm on q and k before RoPE (Qwen3), grouped-query attention, o_proj.
//   MlaAttention: DeepSeek multi-head latent attention. q from q_proj, or through
//     the q-LoRA (q_a_proj -> q_a_layernorm -> q_b_proj); kv_a_proj_with_mqa gives the
//     latent c_kv (kv_lora_rank) and one shared rotary key k_pe. Only c_kv (after
//     kv_a_layernorm) and k_pe (after RoPE) are cached. kv_b_proj is split per head
//     into W_UK [nope, kv_lora] and W_UV [v, kv_lora] and absorbed: the score is
//     (W_UK^T q_nope) . c_kv + q_pe . k_pe, the output W_UV (sum_p p * c_kv), which
//     equals HF's expand-then-attend up to float summation order. W_UK^T and W_UV of
//     every head run as one grouped GEMM each (one expert per head, all tokens of a
//     chunk its rows). A GGUF holds them as they are (attn_k_b, attn_v_b): a quantised
//     pair stays in its codes (int8 inputs per token, as every coded linear's).
//
// Tensor parallelism (heads split over a TP group of `tp` ranks): q/k/v (q_b, kv_b)
// are column-parallel by heads, o_proj is row-parallel; forward() writes this rank's
// partial o_proj output and the caller all-reduces it over the group.
// Not thread-safe (scratch buffers).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/quant_weights.h"
#include "model/batch.h"
#include "model/kv_cache.h"
#include "model/layers.h"
#include "model/model_config.h"

namespace moe {

// Checkpoint key prefixes of one layer's attention (without ".weight").
struct AttentionKeys {
  int64_t layer = -1;
  // GQA
  std::string q, k, v, o;
  std::string q_norm, k_norm;  // empty: none
  // MLA
  std::string q_a, q_a_norm, q_b;  // q-LoRA (q_lora_rank > 0); else `q` is q_proj
  std::string kv_a, kv_a_norm, kv_b;
  // kv_b_proj's halves as GGUF holds them (loader/gguf/gguf_deepseek.h; read instead of
  // kv_b when ModelConfig::mla_split_kv_b): k_b [heads * kv_lora, nope] (each head's W_UK
  // transposed), v_b [heads * v, kv_lora] (each head's W_UV).
  std::string k_b, v_b;
  // FastDeploy's fused qkv_proj (ERNIE; loaded when ModelConfig::int8_attention); empty: none
  std::string qkv;
  // The prefixes above whose nn.Linear has a bias (as transformers builds the family's
  // module: Qwen2-MoE q/k/v, Qwen3-MoE all four with attention_bias, ...).
  std::vector<std::string> biased;
  bool has_bias(const std::string& prefix) const;
};

// Every tensor one layer's attention reads on TP rank `tp_rank` of `tp`, by what it is
// for (names from AttentionKeys, shapes from the config, the TP ShardRules of the file
// comment). The constructors below load exactly these; model_reads lists them.
struct AttentionReads {
  std::optional<LinearRead> q, k, v;             // GQA; MLA: q_proj without q-LoRA
  LinearRead o;
  std::optional<TensorRead> q_norm, k_norm;      // GQA with per-head q/k norm
  std::optional<LinearRead> q_a, q_b, kv_a;      // MLA
  std::optional<TensorRead> q_a_norm, kv_a_norm, kv_b;
  std::optional<TensorRead> k_b, v_b;            // MLA with ModelConfig::mla_split_kv_b
  // ModelConfig::int8_attention: q, k, v as column blocks of the int8 qkv_proj (each
  // this rank's heads), o_proj row-parallel (loader/quant_weights.h); then q/k/v/o above
  // are unset (o: its weight key only, for messages).
  std::optional<Int8LinearRead> i8_q, i8_k, i8_v, i8_o;
  std::vector<TensorRead> all() const;           // every one, in load order
};
// Throws if tp does not divide the heads.
AttentionReads attention_reads(const ModelConfig& cfg, const AttentionKeys& keys, int tp_rank, int tp);
// How GQA's key/value heads lie over tp ranks: split when tp divides them; when there
// are fewer KV heads than ranks (tp a multiple of them), rank r holds the one KV head
// its query heads read, KV head r / (tp / n_kv), replicated on tp / n_kv ranks (as vLLM
// does: Qwen3-235B-A22B has 4 KV heads for 8+ ranks). Throws naming the flag otherwise.
ShardSpec kv_head_spec(int64_t n_kv_heads, int tp_rank, int tp);
inline int64_t kv_heads_per_rank(int64_t n_kv_heads, int tp) { return n_kv_heads >= tp ? n_kv_heads / tp : 1; }

struct AttnScratch {
  LinearScratch lin;
  Tensor q, k, v, ctx, tmp, lat;  // grow-only f32 buffers
  static float* ensure(Tensor& t, int64_t n);
};

struct AttnContext {
  const StepBatch* batch = nullptr;
  const RopeTables* rope = nullptr;
  KvCache* cache = nullptr;
  int64_t layer = 0;
};

class GqaAttention {
 public:
  // lin: how the projections are stored (load_linear: the compute dtype, W8A8, W4A8, or
  // GGUF / GPTQ int4 kept as it is).
  GqaAttention(const Checkpoint& ck, const ModelConfig& cfg, const AttentionKeys& keys, const LinearOptions& lin,
               int tp_rank, int tp_size);
  // x [T, H] f32 (normed) -> out [T, H] f32, this rank's partial o_proj output.
  void forward(const AttnContext& ctx, const float* x, float* out, AttnScratch& s) const;
  int64_t cache_dim() const { return n_kv_ * head_dim_; }  // both planes
  // int8 attention: the checkpoint's q_matmul / s_matmul scales, read and checked but not
  // applied (loader/quant_weights.h AttentionQuantScales).
  bool unapplied_qs_scales() const { return qs_scales_; }

 private:
  int64_t n_heads_ = 0, n_kv_ = 0, head_dim_ = 0;  // this rank's heads
  // int8 KV cache steps (FastDeploy cachek/cachev_matmul): f32 [1] or [n_kv*hd] of this
  // rank's channels; undefined: K and V are cached as computed.
  Tensor cache_k_, cache_v_;
  bool qs_scales_ = false;
  double eps_ = 1e-6, scale_ = 1;
  Rope rope_;
  Linear q_, k_, v_, o_;  // q [n_heads*hd, H], k/v [n_kv*hd, H], o [H, n_heads*hd]
  Tensor q_norm_, k_norm_;  // f32 [hd] or undefined
};

class MlaAttention {
 public:
  // lin as for GqaAttention, for q_a / q_b (or q), kv_a and o. kv_b (absorbed into the
  // attention) is held in lin.compute (f32, bf16, or I8: W8A8, also under w4a8 linears);
  // a GGUF's quantised halves stay in their codes under lin.keep_int4.
  MlaAttention(const Checkpoint& ck, const ModelConfig& cfg, const AttentionKeys& keys, const LinearOptions& lin,
               int tp_rank, int tp_size);
  void forward(const AttnContext& ctx, const float* x, float* out, AttnScratch& s) const;
  // The absorbed halves of kv_b (for inspection: their format follows the projections').
  const Linear& uk() const { return uk_; }
  const Linear& uv() const { return uv_; }
  int64_t cache_a_dim() const { return kv_lora_; }
  int64_t cache_b_dim() const { return rope_dim_; }

 private:
  int64_t n_heads_ = 0, q_lora_ = 0, kv_lora_ = 0, nope_ = 0, rope_dim_ = 0, v_dim_ = 0;
  double eps_ = 1e-6, scale_ = 1;
  Rope rope_;
  Linear q_;             // [n_heads*(nope+rope), H] (no q-LoRA)
  Linear q_a_, q_b_;     // [q_lora, H], [n_heads*(nope+rope), q_lora]
  Tensor q_a_norm_;      // f32 [q_lora]
  Linear kv_a_;          // [kv_lora + rope, H], replicated
  Tensor kv_a_norm_;     // f32 [kv_lora]
  // kv_b absorbed, one grouped-GEMM expert per head (load_head_linears):
  Linear uk_;            // n_heads x [kv_lora, nope]: W_UK^T, q_nope -> its latent query
  Linear uv_;            // n_heads x [v, kv_lora]: W_UV, the latent output -> v
  Linear o_;             // [H, n_heads*v], row-parallel
};

}  // namespace moe
