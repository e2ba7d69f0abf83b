// Decoder building blocks: weight loading with tensor-parallel slicing, dense
// projections (nn.Linear), RMSNorm, token embedding and rotary embeddings.
//
// Weights are described before they are loaded (TensorRead / LinearRead: key, shape,
// ShardRule), and loaded through load_sharded, so a TP rank reads only its slice's
// bytes and the same descriptions give `moe-ep inspect` its checks and read plan
// (model/weights.h).
//
// Activations are f32 everywhere between blocks. In bf16 mode the weights are
// packed as bf16 and a projection's input is rounded to bf16 right before its GEMM
// (f32 accumulation), which is what the grouped GEMM reads.
//
// Projections run on the grouped GEMM with one expert holding every row: it is
// fast for 1 row (decode) and many rows (prefill), and batch-invariant (a row's
// result does not depend on the other rows), so a KV-cached decode step gives the
// same bits as recomputing the whole prefix.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "loader/shard.h"
#include "model/model_config.h"

namespace moe {
class WeightsCache;  // loader/weights_cache/weights_cache.h
}  // namespace moe

namespace moe {

// How a rank of a tensor-parallel group of `size` holds an [out, in] weight.
enum class Split : uint8_t {
  None,    // replicated
  Column,  // rows [r*out/size, (r+1)*out/size) of the output dim (and of the bias)
  Row,     // columns [r*in/size, ...) of the input dim; the bias only on rank 0
};

struct ShardSpec {
  Split split = Split::None;
  int rank = 0;
  int size = 1;
};

// The reads of one nn.Linear: "<prefix>.weight" [out, in] and, when the module has
// one, "<prefix>.bias" [out], each with the ShardRule of `s` (column: both sliced on
// the output dim; row: the weight on the input dim, the bias added once).
struct LinearRead {
  TensorRead weight;
  std::optional<TensorRead> bias;
};
LinearRead linear_read(const std::string& prefix, int64_t out, int64_t in, bool bias, const ShardSpec& s = {},
                       int64_t layer = -1);
// "<prefix>.weight" [n], replicated: an RMSNorm's weight.
TensorRead norm_read(const std::string& prefix, int64_t n, int64_t layer = -1);

// This rank's slice of r.key as an owned f32 copy (errors name the key, the file and
// both shapes); only the slice's bytes are read. An FP8 block-scaled tensor is
// dequantised exactly (loader/fp8_weights.h).
Tensor load_f32(const Checkpoint& ck, const TensorRead& r);

struct Linear {
  // 1 x [out_local, in_local]: the compute dtype (f32 or bf16), I8 (W8A8: weights
  // quantised per output channel at load, inputs per token in linear_forward), or
  // F8E4M3 (a block-scaled FP8 checkpoint with bf16 compute: the codes as stored,
  // dequantised inside the GEMM; loader/fp8_weights.h).
  PackedExperts w;
  Tensor bias;      // f32 [out_local], or undefined
  // (An act-order GPTQ weight held in int4 with its columns sorted by group has its input
  // order in w.in_perm: grouped_gemm gathers the quantised input rows to match.)
  int64_t n_out() const { return w.n; }
  int64_t n_in() const { return w.k; }
};

// How load_linear / make_linear store a weight. A DType converts to the plain case.
struct LinearOptions {
  LinearOptions(DType c = DType::F32) : compute(c) {}  // NOLINT(google-explicit-constructor)
  // f32 or bf16, or I8: W8A8 (--quantize-linears w8a8: per-output-channel int8 weights).
  DType compute;
  // > 0 (--quantize-linears w4a8): float weights become W4A8 int4 with zero points and
  // groups of this many inputs (32, 64 or 128), as --quantize w4a8 makes the experts;
  // `compute` is then unused. Under --tp a row-parallel projection quantises its slice.
  int64_t int4_group = 0;
  // GGUF integer-coded and GPTQ / AWQ / compressed-tensors int4 weights stay in their
  // codes (exactly).
  bool keep_int4 = false;
  // --weights-cache: load_linear takes the weight from the cache when it holds a valid
  // record of it, and records it when it packs it (loader/weights_cache/weights_cache.h).
  WeightsCache* cache = nullptr;
  static LinearOptions keeping_int4(DType c) {
    LinearOptions o(c);
    o.keep_int4 = true;
    return o;
  }
};

// bf16 compute keeps an FP8 block-scaled weight as e4m3; f32 compute dequantises it.
// keep_int4: a GGUF weight of an integer-coded type (Q4_0 ... Q6_K) becomes a group-coded
// linear holding its codes, 4-bit types in 4 bits, 5- and 6-bit in 6, Q8_0 in 8, exactly
// (loader/gguf/gguf_experts.h; int8 inputs per token, as W8A8's), whatever `compute`;
// otherwise it is dequantised like any float weight. The same flag keeps a GPTQ / AWQ /
// compressed-tensors int4 weight ("<m>.qweight" / "<m>.weight_packed" in place of
// "<m>.weight": loader/hf_int4/hf_int4.h) in int4 with its own groups; false dequantises
// it exactly. int4_group: every other weight (float, FP8, an int4 one not kept) is
// quantised to int4.
Linear load_linear(const Checkpoint& ck, const LinearRead& r, const LinearOptions& o);
// Packs an [out, in] matrix of f32, bf16 or f16 (any row stride: e.g. a view of the
// checkpoint; tests, tied lm_head).
Linear make_linear(const Tensor& w, const LinearOptions& o, const Tensor& bias = {});

// Per-head matrices run as one grouped GEMM (MLA's absorbed kv_b halves, model/attention.h):
// a Linear whose w holds one [rows, in] matrix per head as its experts (w.n_experts = heads).
// Read from heads [first, first + count) of a [heads_total * rows, in] weight "<key>.weight",
// each head's rows a column slice of its own (load_linear's reads, so a GGUF's coded type
// stays in its codes under o.keep_int4; o.int4_group must be 0). With o.cache the stack is
// one record.
struct HeadLinearsRead {
  std::string key;
  int64_t heads_total = 0, rows = 0, in = 0;
  int64_t first = 0, count = 0;
  int64_t layer = -1;
  TensorRead head(int64_t h) const;  // the read of head first + h
};
Linear load_head_linears(const Checkpoint& ck, const HeadLinearsRead& r, const LinearOptions& o);
// The same from count float matrices: head(h) gives head h's [rows, in] (same shape for all).
Linear make_head_linears(int64_t count, const std::function<Tensor(int64_t)>& head, const LinearOptions& o);

// Grows-only scratch for the bf16 copy (or the Q8 rows) of a projection's input. Not thread-safe.
struct LinearScratch {
  Tensor a;
};
// y[T, out] f32 = x[T, in] f32 . W^T (+ bias). ldx/ldy: elements between rows (0: dense).
void linear_forward(const Linear& l, const float* x, int64_t T, float* y, LinearScratch& s, int64_t ldx = 0,
                    int64_t ldy = 0);
// Several projections of one input x[T, in] (attention's q, k and v): each y[T, out] =
// x . W^T (+ bias), as linear_forward gives it, bit for bit, with the input quantised
// (or converted to bf16) once for all that read it alike, and their GEMMs run under one
// wake-up of the thread team (grouped_gemm_many) instead of one each.
struct LinearOut {
  const Linear* l;
  float* y;
};
void linear_forward_shared(std::initializer_list<LinearOut> outs, const float* x, int64_t T, LinearScratch& s);
// A head linear (load_head_linears): x [heads * T, in] holds head h's T rows at row h * T,
// y [heads * T, out] likewise; each row as linear_forward would give it with that head's
// matrix, the heads' GEMMs under one wake-up of the team. No bias.
void head_linear_forward(const Linear& l, const float* x, int64_t T, float* y, LinearScratch& s);

// y[T, n] = w * x / sqrt(mean(x^2) + eps), in f32 as HF does (y may alias x).
void rms_norm(const float* x, const float* w, int64_t T, int64_t n, double eps, float* y);

// Row-wise work (norms, RoPE, residual adds, embedding rows) of at least this many
// elements goes over the threads (~10 us of one core's work: below it, waking the team
// costs more). Each row is computed as it is alone, so the bits do not depend on it.
inline constexpr int64_t kRowParallelElems = int64_t{1} << 15;

// Rotary tables for one step: cos/sin [T, dim/2] of each token's position, already
// multiplied by the rope attention factor (YaRN).
struct RopeTables {
  int64_t half = 0;
  std::vector<float> cos, sin;
};
class Rope {
 public:
  Rope() = default;
  explicit Rope(const RopeConfig& cfg);
  void tables(const int32_t* positions, int64_t T, RopeTables& out) const;
  // Rotates the `n_heads` vectors of `dim` floats at x (stride `ld` between heads) of token t.
  void apply(float* x, int64_t n_heads, int64_t ld, const RopeTables& tab, int64_t t) const;
  bool interleaved() const { return interleaved_; }
  double attention_factor() const { return attention_factor_; }

 private:
  std::vector<float> inv_freq_;  // [dim/2]
  double attention_factor_ = 1.0;
  bool interleaved_ = false;
};

}  // namespace moe
