#include "model/layers.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "kernels/quant.h"
#include "loader/fp8_weights.h"
#include "loader/gguf/gguf_experts.h"
#include "loader/hf_int4/hf_int4.h"
#include "loader/weights_cache/weight_records.h"

namespace moe {

LinearRead linear_read(const std::string& prefix, int64_t out, int64_t in, bool bias, const ShardSpec& s,
                       int64_t layer) {
  ShardRule w_rule, b_rule;  // replicated unless split
  if (s.split == Split::Column) {
    w_rule = ShardRule::column();
    b_rule = ShardRule::column();
  } else if (s.split == Split::Row) {
    w_rule = ShardRule::row();
    b_rule = ShardRule::row_bias();  // rank 0 adds it; the all-reduce sums it once
  }
  LinearRead r{{prefix + ".weight", {out, in}, w_rule, s.rank, s.size, layer}, std::nullopt};
  if (bias) r.bias = TensorRead{prefix + ".bias", {out}, b_rule, s.rank, s.size, layer};
  return r;
}

TensorRead norm_read(const std::string& prefix, int64_t n, int64_t layer) {
  return {prefix + ".weight", {n}, ShardRule::replicated(), 0, 1, layer};
}

Tensor load_f32(const Checkpoint& ck, const TensorRead& r) {
  if (hf_int4::is_int4_weight(ck, r.key)) return hf_int4::dequantize(ck, r);  // exact (loader/hf_int4)
  if (is_fp8_weight(ck, r.key)) return dequantize_fp8(load_fp8_slice(ck, r), DType::F32);  // exact products
  return load_sharded(ck, r, DType::F32);
}

Linear make_linear(const Tensor& w, const LinearOptions& o, const Tensor& bias) {
  MOE_CHECK(w.ndim() == 2, "linear weight must be 2-D, got {}", w.describe());
  Linear l;
  l.w = o.int4_group > 0 ? make_packed_experts_int4(1, w.dim(0), w.dim(1), /*gated=*/false, o.int4_group)
                         : make_packed_experts(1, w.dim(0), w.dim(1), o.compute, false);
  pack_expert(l.w, 0, w);
  if (bias.defined()) l.bias = bias.to(DType::F32);
  return l;
}

namespace {

Linear load_linear_packed(const Checkpoint& ck, const LinearRead& r, const LinearOptions& o);

CacheRecord encode_linear(const Linear& l) {
  CacheRecord c;
  encode_packed(c, "w.", l.w);
  c.put("bias", l.bias);
  return c;
}

// Checked against this rank's slice of the weight (plan_shard: pure arithmetic).
Linear decode_linear(const CacheRecord& c, const LinearRead& r) {
  Linear l;
  l.w = decode_packed(c, "w.");
  const Shape want = plan_shard(r.weight).out_shape;
  MOE_CHECK(want.size() == 2 && l.w.n_experts == 1 && l.w.n == want[0] && l.w.k == want[1],
            "a linear of {} x [{}, {}] where this rank's slice is {}", l.w.n_experts, l.w.n, l.w.k, shape_str(want));
  l.bias = c.tensor("bias");
  MOE_CHECK(!l.bias.defined() || (r.bias && l.bias.dtype() == DType::F32 && l.bias.numel() == l.w.n),
            "bias: {} for a linear of {} outputs{}", l.bias.describe(), l.w.n, r.bias ? "" : " without one");
  return l;
}

}  // namespace

Linear load_linear(const Checkpoint& ck, const LinearRead& r, const LinearOptions& o) {
  if (!o.cache) return load_linear_packed(ck, r, o);
  const std::string key =
      fmt::format("linear {}; bias {}; compute {} group {} keep-codes {}", describe(r.weight),
                  r.bias ? describe(*r.bias) : "none", dtype_name(o.compute), o.int4_group, o.keep_int4);
  return cached_load<Linear>(
      o.cache, key, [&] { return load_linear_packed(ck, r, o); }, encode_linear,
      [&](const CacheRecord& c) { return decode_linear(c, r); });
}

namespace {

Linear load_linear_packed(const Checkpoint& ck, const LinearRead& r, const LinearOptions& o) {
  const DType compute = o.compute;
  const bool gguf_q4_0_as_int4 = o.keep_int4;
  const Tensor bias = r.bias ? load_f32(ck, *r.bias) : Tensor();
  Linear l;
  if (hf_int4::is_int4_weight(ck, r.weight.key)) {
    // GPTQ / AWQ / compressed-tensors int4: stays int4 with the checkpoint's groups, or is
    // dequantised exactly (loader/hf_int4/hf_int4.h; also an act-order g_idx, or a TP
    // slice that cuts a group).
    std::optional<std::vector<int64_t>> order;  // act-order: the input columns sorted by group
    if (gguf_q4_0_as_int4 && (hf_int4::int4_exact(ck, r.weight) || (order = hf_int4::act_order(ck, r.weight)))) {
      const hf_int4::Int4Slice s = hf_int4::read_slice(ck, r.weight, order ? &*order : nullptr);
      l.w = make_packed_experts_int4(1, s.u.dim(0), s.u.dim(1), /*gated=*/false, hf_int4::kernel_group(ck));
      pack_expert_q4(l.w, 0, s.u, s.zero, s.scale);
      if (order) {  // grouped_gemm gathers the Q8 input rows in this order
        l.w.in_perm = Tensor::empty({1, static_cast<int64_t>(order->size())}, DType::I32);
        for (size_t j = 0; j < order->size(); ++j) l.w.in_perm.data<int32_t>()[j] = static_cast<int32_t>((*order)[j]);
      }
      l.bias = bias;
    } else {
      l = make_linear(hf_int4::dequantize(ck, r.weight), o, bias);
    }
  } else if (gguf_q4_0_as_int4 && gguf::is_coded(ck, r.weight)) {
    const ShardPlan p = plan_shard(r.weight);
    MOE_CHECK(p.out_shape.size() == 2, "tensor '{}': a linear layer's weight must be a matrix, got {}", r.weight.key,
              shape_str(p.out_shape));
    l.w = make_packed_experts_coded(1, p.out_shape[0], p.out_shape[1], /*gated=*/false,
                                    gguf::common_format(ck, {&r.weight}));
    gguf::pack_matrix(ck, l.w, 0, r.weight);
    l.bias = bias;
  } else if (compute == DType::BF16 && o.int4_group == 0 && is_fp8_weight(ck, r.weight.key)) {
    // Block-scaled FP8 stays e4m3 in memory; the GEMM dequantises it panel by panel.
    const Fp8Slice s = load_fp8_slice(ck, r.weight);
    MOE_CHECK(s.codes.ndim() == 2, "fp8 weight '{}': a linear layer's weight must be a matrix, got {}", r.weight.key,
              s.codes.describe());
    l.w = make_packed_fp8(1, s.rows(), s.cols(), /*gated=*/false, s.block_k);
    pack_fp8(l.w, 0, s);
    l.bias = bias;
  } else if (is_fp8_weight(ck, r.weight.key)) {
    l = make_linear(load_f32(ck, r.weight), o, bias);  // dequantised exactly
  } else {
    // Packed from the checkpoint's dtype (a view of the mapping, or this rank's strided
    // slice), not from an f32 copy: no transient 2x (bf16) copy of e.g. a [V, H] lm_head.
    const Tensor w = load_sharded(ck, r.weight);
    MOE_CHECK(w.dtype() == DType::F32 || w.dtype() == DType::BF16 || w.dtype() == DType::F16,
              "tensor '{}' in {} has dtype {}, expected f32, bf16 or f16 (or f8_e4m3 with block scales)",
              r.weight.key, ck.file_of(r.weight.key), dtype_name(w.dtype()));
    l = make_linear(w, o, bias);
  }
  release_sharded(ck, r.weight);  // packed: the file's pages leave the process
  return l;
}

}  // namespace

TensorRead HeadLinearsRead::head(int64_t h) const {
  MOE_CHECK(h >= 0 && h < count && first + count <= heads_total, "head {} of [{}, {}) of {} heads of '{}'", h, first,
            first + count, heads_total, key);
  const ShardSpec s{Split::Column, static_cast<int>(first + h), static_cast<int>(heads_total)};
  return linear_read(key, heads_total * rows, in, false, s, layer).weight;
}

namespace {

// count per-head Linears (one expert each, all of one format) as one of count experts:
// load_linear's formats (a GGUF's codes, FP8, ...) without a second packer of each.
Linear stack_heads(int64_t count, const std::function<Linear(int64_t)>& head) {
  MOE_CHECK(count > 0, "a head linear needs at least one head");
  Linear out;
  for (int64_t h = 0; h < count; ++h) {
    const Linear one = head(h);
    if (h == 0) out.w = make_packed_like(one.w, count);
    copy_expert(out.w, h, one.w, 0);  // checks that the format is the first head's
  }
  return out;
}

}  // namespace

Linear load_head_linears(const Checkpoint& ck, const HeadLinearsRead& r, const LinearOptions& o) {
  MOE_CHECK(o.int4_group == 0, "head linears of '{}' are not requantised to int4", r.key);
  LinearOptions one = o;
  one.cache = nullptr;  // the stack is the record, not each head
  auto load = [&] { return stack_heads(r.count, [&](int64_t h) { return load_linear(ck, {r.head(h), {}}, one); }); };
  if (!o.cache) return load();
  const std::string key = fmt::format("head linears {} [{}, {}) of {} x [{}, {}]; compute {} keep-codes {}", r.key,
                                      r.first, r.first + r.count, r.heads_total, r.rows, r.in,
                                      dtype_name(o.compute), o.keep_int4);
  return cached_load<Linear>(
      o.cache, key, load, encode_linear,
      [&](const CacheRecord& c) {
        Linear l;
        l.w = decode_packed(c, "w.");
        MOE_CHECK(l.w.n_experts == r.count && l.w.n == r.rows && l.w.k == r.in && !l.w.gated,
                  "{} heads of [{}, {}] where {} x [{}, {}] are wanted", l.w.n_experts, l.w.n, l.w.k, r.count, r.rows,
                  r.in);
        return l;
      });
}

Linear make_head_linears(int64_t count, const std::function<Tensor(int64_t)>& head, const LinearOptions& o) {
  MOE_CHECK(count > 0 && o.int4_group == 0, "head linears: {} heads, int4 group {} (none expected)", count,
            o.int4_group);
  Linear out;
  for (int64_t h = 0; h < count; ++h) {  // each head packed once, straight into its slot
    const Tensor w = head(h);
    if (h == 0) out.w = make_packed_experts(count, w.dim(0), w.dim(1), o.compute, /*gated=*/false);
    MOE_CHECK(w.ndim() == 2 && w.dim(0) == out.w.n && w.dim(1) == out.w.k, "head linears: head {} is {}, head 0 [{}, {}]",
              h, w.describe(), out.w.n, out.w.k);
    pack_expert(out.w, h, w);
  }
  return out;
}

namespace {

// x[T, K] (row stride ldx) as l's GEMM reads it: f32 as is, bf16 rows, or W8A8's Q8 rows
// (each row quantised with its own absmax, or l's static input scale) in s.a.
const void* linear_input(const Linear& l, const float* x, int64_t T, int64_t ldx, LinearScratch& s, int64_t* lda) {
  const int64_t K = l.n_in();
  *lda = ldx;
  if (l.w.dtype == DType::I8) {
    const int64_t rb = q8_row_bytes(K);
    if (!s.a.defined() || s.a.dtype() != DType::I8 || s.a.numel() < T * rb) s.a = Tensor::empty({T * rb}, DType::I8);
    QuantizeRowsParams q;
    q.x = x;
    q.x_dtype = DType::F32;
    q.ldx = ldx;
    q.rows = T;
    q.k = K;
    q.dst = s.a.raw();
    q.ld_dst = rb;
    // A static input scale (FastDeploy W8A8, loader/quant_weights.h) replaces the row's absmax.
    q.static_scale = l.w.act_scale.defined() ? l.w.act_scale.data<float>() : nullptr;
    quantize_rows_q8(q);
    *lda = rb;
    return s.a.raw();
  }
  if (l.w.act_dtype() != DType::F32) {
    const DType at = l.w.act_dtype();  // bf16 (FP8 weights compute on bf16 activations too)
    if (!s.a.defined() || s.a.dtype() != at || s.a.numel() < T * K) s.a = Tensor::empty({T * K}, at);
    for (int64_t t = 0; t < T; ++t)
      convert_from_f32(x + t * ldx, static_cast<char*>(s.a.raw()) + t * K * dtype_size(at), at, K);
    *lda = K;
    return s.a.raw();
  }
  return x;
}

// The GEMM y[T, N] (row stride ldy) = a . W^T, a from linear_input; offsets = {0, T}.
GroupedGemmParams linear_gemm_params(const Linear& l, const void* a, int64_t lda, const int64_t* offsets, float* y,
                                     int64_t ldy) {
  GroupedGemmParams g;
  g.w = &l.w;
  g.a = a;
  g.lda = lda;
  g.offsets = offsets;
  g.c = y;
  g.c_dtype = DType::F32;
  g.ldc = ldy;
  return g;
}

void add_bias(const Linear& l, int64_t T, float* y, int64_t ldy) {
  if (!l.bias.defined()) return;
  const float* b = l.bias.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0, N = l.n_out(); n < N; ++n) y[t * ldy + n] += b[n];
}

// Whether b reads the input exactly as a does (linear_input's result serves both).
bool same_input(const Linear& a, const Linear& b) {
  if (a.n_in() != b.n_in() || a.w.dtype != b.w.dtype || a.w.act_dtype() != b.w.act_dtype()) return false;
  if (a.w.dtype != DType::I8) return true;
  const Tensor &sa = a.w.act_scale, &sb = b.w.act_scale;
  if (sa.defined() != sb.defined()) return false;
  return !sa.defined() || (sa.numel() == sb.numel() && std::memcmp(sa.raw(), sb.raw(), sa.nbytes()) == 0);
}

}  // namespace

void linear_forward(const Linear& l, const float* x, int64_t T, float* y, LinearScratch& s, int64_t ldx,
                    int64_t ldy) {
  if (T == 0) return;
  if (ldx == 0) ldx = l.n_in();
  if (ldy == 0) ldy = l.n_out();
  int64_t lda = 0;
  const void* a = linear_input(l, x, T, ldx, s, &lda);
  const int64_t offsets[2] = {0, T};
  grouped_gemm(linear_gemm_params(l, a, lda, offsets, y, ldy));
  add_bias(l, T, y, ldy);
}

void head_linear_forward(const Linear& l, const float* x, int64_t T, float* y, LinearScratch& s) {
  if (T == 0) return;
  const int64_t heads = l.w.n_experts;
  int64_t lda = 0;
  const void* a = linear_input(l, x, heads * T, l.n_in(), s, &lda);
  std::vector<int64_t> offsets(static_cast<size_t>(heads + 1));
  for (int64_t h = 0; h <= heads; ++h) offsets[static_cast<size_t>(h)] = h * T;
  grouped_gemm(linear_gemm_params(l, a, lda, offsets.data(), y, l.n_out()));
}

void linear_forward_shared(std::initializer_list<LinearOut> outs, const float* x, int64_t T, LinearScratch& s) {
  if (T == 0 || outs.size() == 0) return;
  // Those that read the input as the first does share its prepared rows; any other (e.g.
  // a different static input scale) prepares its own afterwards, in s.a too.
  // Their GEMMs run in one parallel region (grouped_gemm_many).
  const Linear& first = *outs.begin()->l;
  int64_t lda = 0;
  const void* a = linear_input(first, x, T, first.n_in(), s, &lda);
  const int64_t offsets[2] = {0, T};
  GroupedGemmParams gs[8];
  size_t n = 0;
  for (const LinearOut& o : outs)
    if (same_input(first, *o.l)) {
      MOE_CHECK(n < std::size(gs), "linear_forward_shared: at most {} projections share an input", std::size(gs));
      gs[n++] = linear_gemm_params(*o.l, a, lda, offsets, o.y, o.l->n_out());
    }
  grouped_gemm_many({gs, n});
  for (const LinearOut& o : outs)
    if (same_input(first, *o.l)) add_bias(*o.l, T, o.y, o.l->n_out());
  for (const LinearOut& o : outs)
    if (!same_input(first, *o.l)) linear_forward(*o.l, x, T, o.y, s);
}

namespace {

// The sum of squares of a row in a fixed order that does not depend on the ISA or the
// batch: 16 running sums (element i into sum i % 16), added in halves (8 + 8, 4 + 4, ...),
// then the last n % 16 elements in order. One running sum was a chain of n dependent adds
// (an estimate from the add's 4-cycle latency: ~3 us for 2048 values, ~55 us of a 4-layer
// decode step with the q/k norms); 16 vectorise and overlap. Measured with `generate
// --profile`, "other" (the norms, residual adds) fell from 0.11-0.14 to 0.08-0.12 ms a step
// on 16 threads with the router and sampler changes of the same session (docs/PERF.md).
float sum_of_squares(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += x[i + l] * x[i + l];
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) s[l] += s[l + h];
  float ss = s[0];
  for (; i < n; ++i) ss += x[i] * x[i];
  return ss;
}

}  // namespace

void rms_norm(const float* x, const float* w, int64_t T, int64_t n, double eps, float* y) {
  // Rows go over the threads when there are many (prefill: 512 tokens x 2048 took 2.3 ms
  // a norm on one core, and a layer has two, plus q/k norms of 36 heads a token). Each
  // row's sum is its own (sum_of_squares), so every row has the bits it has alone.
#pragma omp parallel for schedule(static) if (T > 1 && T * n >= kRowParallelElems && !omp_in_parallel())
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    const float ss = sum_of_squares(xr, n);
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * r);
  }
}

Rope::Rope(const RopeConfig& cfg) : interleaved_(cfg.interleaved) { inv_freq_ = rope_inv_freq(cfg, &attention_factor_); }

void Rope::tables(const int32_t* pos, int64_t T, RopeTables& out) const {
  const int64_t half = static_cast<int64_t>(inv_freq_.size());
  out.half = half;
  out.cos.resize(T * half);
  out.sin.resize(T * half);
  const float af = static_cast<float>(attention_factor_);
  // A cos and a sin in double per (token, frequency): ~3 ms for 512 tokens on one core.
#pragma omp parallel for schedule(static) if (T > 1 && T * half >= kRowParallelElems / 8 && !omp_in_parallel())
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos[t]) * inv_freq_[i];  // f32 product, as HF
      out.cos[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle))) * af;
      out.sin[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * af;
    }
}

void Rope::apply(float* x, int64_t n_heads, int64_t ld, const RopeTables& tab, int64_t t) const {
  const int64_t half = tab.half;
  const float* c = tab.cos.data() + t * half;
  const float* s = tab.sin.data() + t * half;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * ld;
    for (int64_t i = 0; i < half; ++i) {
      // interleaved: pair (2i, 2i+1) (ERNIE, DeepSeek); else rotate_half: pair (i, i + half).
      float& a = interleaved_ ? v[2 * i] : v[i];
      float& b = interleaved_ ? v[2 * i + 1] : v[i + half];
      const float x1 = a, x2 = b;
      a = x1 * c[i] - x2 * s[i];
      b = x2 * c[i] + x1 * s[i];
    }
  }
}

}  // namespace moe
