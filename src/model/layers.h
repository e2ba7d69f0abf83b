// Decoder building blocks: weight loading with tensor-parallel slicing, dense
// projections (nn.Linear), RMSNorm, token embedding and rotary embeddings.
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
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "model/model_config.h"

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

// The whole tensor `key` as f32, checked to have `shape` (error names key, file, shapes).
Tensor load_f32(const Checkpoint& ck, const std::string& key, const Shape& shape);
// This rank's slice of a 2-D [out, in] (or 1-D [out]) tensor, as an owned f32 copy.
Tensor load_slice_f32(const Checkpoint& ck, const std::string& key, const Shape& full_shape, const ShardSpec& s);

struct Linear {
  PackedExperts w;  // 1 x [out_local, in_local], compute dtype (f32 or bf16)
  Tensor bias;      // f32 [out_local], or undefined
  int64_t n_out() const { return w.n; }
  int64_t n_in() const { return w.k; }
};

// Loads "<prefix>.weight" [out, in] (and "<prefix>.bias" [out] when the checkpoint has it).
Linear load_linear(const Checkpoint& ck, const std::string& prefix, int64_t out, int64_t in, DType compute,
                   const ShardSpec& s = {});
// Packs an f32 [out, in] matrix (tests, tied lm_head).
Linear make_linear(const Tensor& w_f32, DType compute, const Tensor& bias = {});

// Grows-only scratch for the bf16 copy of a projection's input. Not thread-safe.
struct LinearScratch {
  Tensor a;
};
// y[T, out] f32 = x[T, in] f32 . W^T (+ bias). ldx/ldy: elements between rows (0: dense).
void linear_forward(const Linear& l, const float* x, int64_t T, float* y, LinearScratch& s, int64_t ldx = 0,
                    int64_t ldy = 0);

// y[T, n] = w * x / sqrt(mean(x^2) + eps), in f32 as HF does (y may alias x).
void rms_norm(const float* x, const float* w, int64_t T, int64_t n, double eps, float* y);

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
