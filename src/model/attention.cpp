#include "model/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/stage_profile.h"
#include "model/attention_kernels.h"
#include "model/registry.h"

namespace moe {

float* AttnScratch::ensure(Tensor& t, int64_t n) {
  n = std::max<int64_t>(n, 1);
  if (!t.defined() || t.numel() < n) t = Tensor::empty({n}, DType::F32);
  return t.data<float>();
}

namespace {

void check_heads(const char* what, int64_t n, int tp) {
  MOE_CHECK(n % tp == 0,
            "attention TP size {} (--tp or --attn-tp) does not divide the model's {} {} (attention heads are split "
            "over the TP ranks)",
            tp, n, what);
}

}  // namespace

ShardSpec kv_head_spec(int64_t n_kv, int r, int tp) {
  MOE_CHECK(n_kv % tp == 0 || (tp % n_kv == 0),
            "{} attention-TP ranks and the model's {} key/value heads: one must divide the other (KV heads are split "
            "over the ranks, or each held by {} / {} ranks)",
            tp, n_kv, tp, n_kv);
  if (n_kv >= tp) return {Split::Column, r, tp};
  return {Split::Column, static_cast<int>(r / (tp / n_kv)), static_cast<int>(n_kv)};
}

bool AttentionKeys::has_bias(const std::string& prefix) const {
  return std::find(biased.begin(), biased.end(), prefix) != biased.end();
}

AttentionReads attention_reads(const ModelConfig& cfg, const AttentionKeys& k, int r, int tp) {
  check_heads("attention heads", cfg.n_heads, tp);
  const int64_t H = cfg.hidden_size, nh = cfg.n_heads, l = k.layer;
  const ShardSpec rep, col{Split::Column, r, tp}, row{Split::Row, r, tp};
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, const ShardSpec& s) {
    return linear_read(prefix, out, in, k.has_bias(prefix), s, l);
  };
  AttentionReads a;
  if (cfg.attention == AttentionKind::Gqa && cfg.int8_attention) {
    check_heads("key/value heads", cfg.n_kv_heads, tp);
    // FastDeploy W8A8: [in, out] int8 qkv_proj = [q | k | v] columns; each block split by heads.
    const int64_t hd = cfg.head_dim, nq = nh * hd, nkv = cfg.n_kv_heads * hd, out = nq + 2 * nkv;
    const std::string qkv = k.qkv.substr(ModelKeys::layer(l).size() + 1), o = k.o.substr(ModelKeys::layer(l).size() + 1);
    auto block = [&](int64_t b, int64_t n) {
      return int8_linear_read({l, qkv, H, out, Int8LinearSpec::Column, r, tp, b, n});
    };
    a.i8_q = block(0, nq);
    a.i8_k = block(nq, nkv);
    a.i8_v = block(nq + nkv, nkv);
    a.i8_o = int8_linear_read({l, o, nq, H, Int8LinearSpec::Row, r, tp});
    a.o.weight = a.i8_o->weight;
    return a;
  }
  if (cfg.attention == AttentionKind::Gqa) {
    const ShardSpec kv = kv_head_spec(cfg.n_kv_heads, r, tp);
    const int64_t hd = cfg.head_dim;
    // q/k/v column-parallel by heads, o_proj row-parallel (model/attention.h).
    a.q = linear(k.q, nh * hd, H, col);
    a.k = linear(k.k, cfg.n_kv_heads * hd, H, kv);
    a.v = linear(k.v, cfg.n_kv_heads * hd, H, kv);
    a.o = linear(k.o, H, nh * hd, row);
    if (!k.q_norm.empty()) {
      a.q_norm = norm_read(k.q_norm, hd, l);
      a.k_norm = norm_read(k.k_norm, hd, l);
    }
    return a;
  }
  const int64_t qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim;
  if (cfg.q_lora_rank > 0) {
    a.q_a = linear(k.q_a, cfg.q_lora_rank, H, rep);
    a.q_a_norm = norm_read(k.q_a_norm, cfg.q_lora_rank, l);
    a.q_b = linear(k.q_b, nh * qk, cfg.q_lora_rank, col);
  } else {
    a.q = linear(k.q, nh * qk, H, col);
  }
  a.kv_a = linear(k.kv_a, cfg.kv_lora_rank + cfg.qk_rope_head_dim, H, rep);  // the shared latent: every rank
  a.kv_a_norm = norm_read(k.kv_a_norm, cfg.kv_lora_rank, l);
  if (cfg.mla_split_kv_b) {  // this rank's heads of k_b [nh*kv_lora, nope] and v_b [nh*v, kv_lora]
    a.k_b = linear_read(k.k_b, nh * cfg.kv_lora_rank, cfg.qk_nope_head_dim, false, col, l).weight;
    a.v_b = linear_read(k.v_b, nh * cfg.v_head_dim, cfg.kv_lora_rank, false, col, l).weight;
  } else {
    // kv_b_proj [nh*(nope+v), kv_lora]: per head nope rows of W_UK then v rows of W_UV.
    a.kv_b = linear_read(k.kv_b, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank, false, col, l).weight;
  }
  a.o = linear(k.o, H, nh * cfg.v_head_dim, row);
  return a;
}

std::vector<TensorRead> AttentionReads::all() const {
  std::vector<TensorRead> out;
  auto add = [&](const std::optional<TensorRead>& t) {
    if (t) out.push_back(*t);
  };
  auto add_linear = [&](const std::optional<LinearRead>& lr) {
    if (!lr) return;
    out.push_back(lr->weight);
    add(lr->bias);
  };
  if (i8_q) {  // the int8 attention: weights and weight scales (the q/k/v blocks of one qkv_proj)
    for (const auto* r : {&i8_q, &i8_k, &i8_v, &i8_o}) {
      out.push_back((*r)->weight);
      out.push_back((*r)->weight_scale);
    }
    return out;
  }
  add_linear(q);
  add_linear(k);
  add_linear(v);
  add(q_norm);
  add(k_norm);
  add_linear(q_a);
  add(q_a_norm);
  add_linear(q_b);
  add_linear(kv_a);
  add(kv_a_norm);
  add(kv_b);
  add(k_b);
  add(v_b);
  add_linear(o);
  return out;
}

// ---- GQA ---------------------------------------------------------------------------

GqaAttention::GqaAttention(const Checkpoint& ck, const ModelConfig& cfg, const AttentionKeys& k,
                           const LinearOptions& lin, int r, int tp) {
  const AttentionReads rd = attention_reads(cfg, k, r, tp);
  n_heads_ = cfg.n_heads / tp;
  n_kv_ = kv_heads_per_rank(cfg.n_kv_heads, tp);
  head_dim_ = cfg.head_dim;
  eps_ = cfg.rms_eps;
  scale_ = cfg.attn_scale;
  RopeConfig rc = cfg.rope;
  rc.dim = head_dim_;
  rope_ = Rope(rc);
  if (rd.i8_q) {
    // FastDeploy W8A8: int8 weights with static input scales, whatever the compute dtype.
    ScaleLoad sl;
    sl.layer = k.layer;
    sl.expert_begin = sl.expert_end = 0;
    sl.activations_only = true;
    const LayerScales scales = load_layer_scales(ck, cfg.moe, sl);
    q_.w = load_int8_linear(ck, cfg.moe, *rd.i8_q, scales);
    k_.w = load_int8_linear(ck, cfg.moe, *rd.i8_k, scales);
    v_.w = load_int8_linear(ck, cfg.moe, *rd.i8_v, scales);
    o_.w = load_int8_linear(ck, cfg.moe, *rd.i8_o, scales);
    const AttentionQuantScales aq =
        load_attention_quant_scales(ck, cfg.moe, k.layer, cfg.n_kv_heads * head_dim_, r, tp);
    cache_k_ = aq.cache_k;
    cache_v_ = aq.cache_v;
    qs_scales_ = aq.has_qs;
  } else {
    q_ = load_linear(ck, *rd.q, lin);
    k_ = load_linear(ck, *rd.k, lin);
    v_ = load_linear(ck, *rd.v, lin);
    o_ = load_linear(ck, rd.o, lin);
  }
  if (rd.q_norm) {
    q_norm_ = load_f32(ck, *rd.q_norm);
    k_norm_ = load_f32(ck, *rd.k_norm);
  }
}

void GqaAttention::forward(const AttnContext& c, const float* x, float* out, AttnScratch& s) const {
  const StepBatch& b = *c.batch;
  const int64_t T = b.n_tokens(), hd = head_dim_, nq = n_heads_ * hd, nkv = n_kv_ * hd;
  if (T == 0) return;
  float* q = AttnScratch::ensure(s.q, T * nq);
  float* k = AttnScratch::ensure(s.k, T * nkv);
  float* v = AttnScratch::ensure(s.v, T * nkv);
  float* ctx = AttnScratch::ensure(s.ctx, T * nq);
  {
    prof::Scope ps(prof::kAttnQkv);
    linear_forward_shared({{&q_, q}, {&k_, k}, {&v_, v}}, x, T, s.lin);
  }
  if (q_norm_.defined()) {
    rms_norm(q, q_norm_.data<float>(), T * n_heads_, hd, eps_, q);
    rms_norm(k, k_norm_.data<float>(), T * n_kv_, hd, eps_, k);
  }
#pragma omp parallel for schedule(static) if (T > 1 && T * (nq + nkv) >= kRowParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    rope_.apply(q + t * nq, n_heads_, hd, *c.rope, t);
    rope_.apply(k + t * nkv, n_kv_, hd, *c.rope, t);
  }
  if (cache_k_.defined()) {
    // int8 KV cache (FastDeploy cachek/cachev_matmul): K (after RoPE) and V as an int8
    // cache holds them, q * step with q = clamp(nearbyint(x / step), -127, 127); the
    // cache stays f32 (loader/quant_weights.h AttentionQuantScales).
    const bool per_ch = cache_k_.numel() > 1;
    const float* sk = cache_k_.data<float>();
    const float* sv = cache_v_.data<float>();
    auto fq = [](float x, float s) { return std::clamp(std::nearbyint(x / s), -127.f, 127.f) * s; };
    for (int64_t i = 0; i < T * nkv; ++i) {
      const int64_t ch = per_ch ? i % nkv : 0;
      k[i] = fq(k[i], sk[ch]);
      v[i] = fq(v[i], sv[ch]);
    }
  }
  for (const SeqSpan& sp : b.seqs)
    for (int64_t i = 0; i < sp.n; ++i) {
      c.cache->put_a(c.layer, sp.slot, sp.start_pos + i, k + (sp.first + i) * nkv);  // rounded to the cache dtype
      c.cache->put_b(c.layer, sp.slot, sp.start_pos + i, v + (sp.first + i) * nkv);
    }
  GqaAttendArgs aa;  // scores, softmax, V sum over the cache: model/attention_kernels.h
  aa.batch = &b;
  aa.cache = c.cache;
  aa.layer = c.layer;
  aa.q = q;
  aa.ctx = ctx;
  aa.n_heads = n_heads_;
  aa.n_kv = n_kv_;
  aa.head_dim = hd;
  aa.scale = static_cast<float>(scale_);
  {
    prof::Scope ps(prof::kAttnCore);
    gqa_attend(aa);
  }
  prof::Scope ps(prof::kAttnOut);
  linear_forward(o_, ctx, T, out, s.lin);
}

// ---- MLA ---------------------------------------------------------------------------

MlaAttention::MlaAttention(const Checkpoint& ck, const ModelConfig& cfg, const AttentionKeys& k,
                           const LinearOptions& lin, int r, int tp) {
  const AttentionReads rd = attention_reads(cfg, k, r, tp);
  n_heads_ = cfg.n_heads / tp;
  q_lora_ = cfg.q_lora_rank;
  kv_lora_ = cfg.kv_lora_rank;
  nope_ = cfg.qk_nope_head_dim;
  rope_dim_ = cfg.qk_rope_head_dim;
  v_dim_ = cfg.v_head_dim;
  eps_ = cfg.rms_eps;
  scale_ = cfg.attn_scale;
  RopeConfig rc = cfg.rope;
  rc.dim = rope_dim_;
  rope_ = Rope(rc);
  if (rd.q_a) {
    q_a_ = load_linear(ck, *rd.q_a, lin);
    q_a_norm_ = load_f32(ck, *rd.q_a_norm);
    q_b_ = load_linear(ck, *rd.q_b, lin);
  } else {
    q_ = load_linear(ck, *rd.q, lin);
  }
  kv_a_ = load_linear(ck, *rd.kv_a, lin);
  kv_a_norm_ = load_f32(ck, *rd.kv_a_norm);
  // kv_b in the other projections' format: f32, bf16, or W8A8 under --quantize-linears
  // (w4a8 too: a head's [512, 128] matrices are not requantised to int4 groups, and int8
  // per output channel keeps every head's bytes at a quarter of f32's, which DeepSeek-V3
  // reads in full every decode step: 61 x 16.8 M weights); a GGUF's quantised halves in
  // their codes under keep_int4.
  LinearOptions kvb(lin.int4_group > 0 ? DType::I8 : lin.compute);
  kvb.keep_int4 = lin.keep_int4;
  kvb.cache = lin.cache;
  if (rd.k_b) {  // a GGUF's attn_k_b / attn_v_b: each head's matrices as stored
    HeadLinearsRead kr{k.k_b, cfg.n_heads, kv_lora_, nope_, r * n_heads_, n_heads_, k.layer};
    HeadLinearsRead vr{k.v_b, cfg.n_heads, v_dim_, kv_lora_, r * n_heads_, n_heads_, k.layer};
    uk_ = load_head_linears(ck, kr, kvb);
    uv_ = load_head_linears(ck, vr, kvb);
  } else {
    const Tensor kv_b = load_f32(ck, *rd.kv_b);  // this rank's heads: [n_heads*(nope+v), kv_lora]
    const int64_t L = kv_lora_;
    auto head = [&](int64_t h) { return kv_b.data<float>() + h * (nope_ + v_dim_) * L; };
    uk_ = make_head_linears(
        n_heads_,
        [&](int64_t h) {  // W_UK^T [kv_lora, nope]
          Tensor t = Tensor::empty({L, nope_}, DType::F32);
          for (int64_t n = 0; n < nope_; ++n)
            for (int64_t l = 0; l < L; ++l) t.data<float>()[l * nope_ + n] = head(h)[n * L + l];
          return t;
        },
        kvb);
    uv_ = make_head_linears(
        n_heads_,
        [&](int64_t h) {  // W_UV [v, kv_lora]: the head's last v rows
          Tensor t = Tensor::empty({v_dim_, L}, DType::F32);
          std::memcpy(t.data<float>(), head(h) + nope_ * L, static_cast<size_t>(v_dim_ * L) * sizeof(float));
          return t;
        },
        kvb);
  }
  o_ = load_linear(ck, rd.o, lin);
}

void MlaAttention::forward(const AttnContext& c, const float* x, float* out, AttnScratch& s) const {
  const StepBatch& b = *c.batch;
  const int64_t T = b.n_tokens(), qk = nope_ + rope_dim_, nq = n_heads_ * qk, L = kv_lora_, R = rope_dim_;
  if (T == 0) return;
  float* q = AttnScratch::ensure(s.q, T * nq);
  float* kv = AttnScratch::ensure(s.k, T * (L + R));
  if (q_lora_ > 0) {
    prof::Scope ps(prof::kAttnQkv);
    float* qa = AttnScratch::ensure(s.tmp, T * q_lora_);
    linear_forward_shared({{&q_a_, qa}, {&kv_a_, kv}}, x, T, s.lin);
    rms_norm(qa, q_a_norm_.data<float>(), T, q_lora_, eps_, qa);
    linear_forward(q_b_, qa, T, q, s.lin);
  } else {
    prof::Scope ps(prof::kAttnQkv);
    linear_forward_shared({{&q_, q}, {&kv_a_, kv}}, x, T, s.lin);
  }
#pragma omp parallel for schedule(static) if (T > 1 && T * (nq + L + R) >= kRowParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    float* row = kv + t * (L + R);
    rms_norm(row, kv_a_norm_.data<float>(), 1, L, eps_, row);
    rope_.apply(row + L, 1, R, *c.rope, t);
    rope_.apply(q + t * nq + nope_, n_heads_, qk, *c.rope, t);
  }
  for (const SeqSpan& sp : b.seqs)
    for (int64_t i = 0; i < sp.n; ++i) {
      const float* row = kv + (sp.first + i) * (L + R);
      c.cache->put_a(c.layer, sp.slot, sp.start_pos + i, row);  // rounded to the cache dtype
      c.cache->put_b(c.layer, sp.slot, sp.start_pos + i, row + L);
    }
  const int64_t nh = n_heads_, V = v_dim_;
  float* ctx = AttnScratch::ensure(s.ctx, T * nh * V);
  // Tokens in chunks, so the head-major buffers below stay at most kLatentChunk floats
  // each (a 4096-token prompt of DeepSeek-V3, 128 heads x 512 latent, would take 1 GiB per
  // buffer whole; its chunks are 64 tokens, rows enough for the prefill GEMM kernel).
  constexpr int64_t kLatentChunk = int64_t{1} << 22;
  const int64_t chunk = std::max<int64_t>(1, kLatentChunk / (nh * L));
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    prof::Scope ps(prof::kAttnCore);
    const int64_t tc = std::min(chunk, T - t0), rows = nh * tc;
    float* hx = AttnScratch::ensure(s.v, rows * std::max(nope_, V));  // q_nope, then v: [nh, tc, .]
    float* q_lat = AttnScratch::ensure(s.tmp, rows * L);                // [nh, tc, L]
    float* o_lat = AttnScratch::ensure(s.lat, rows * L);                // [nh, tc, L]
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < tc; ++i)
        std::memcpy(hx + (h * tc + i) * nope_, q + (t0 + i) * nq + h * qk, static_cast<size_t>(nope_) * sizeof(float));
    head_linear_forward(uk_, hx, tc, q_lat, s.lin);  // W_UK^T q_nope of every head and token
    MlaAttendArgs ma;  // scores, softmax, c_kv sum over the cache: model/attention_kernels.h
    ma.batch = &b;
    ma.cache = c.cache;
    ma.layer = c.layer;
    ma.t0 = t0;
    ma.tc = tc;
    ma.n_heads = nh;
    ma.q_lat = q_lat;
    ma.q_pe = q + nope_;
    ma.pe_ld_t = nq;
    ma.pe_ld_h = qk;
    ma.scale = static_cast<float>(scale_);
    ma.o_lat = o_lat;
    mla_attend(ma);
    head_linear_forward(uv_, o_lat, tc, hx, s.lin);  // W_UV of every head's latent output
    for (int64_t i = 0; i < tc; ++i)
      for (int64_t h = 0; h < nh; ++h)
        std::memcpy(ctx + ((t0 + i) * nh + h) * V, hx + (h * tc + i) * V, static_cast<size_t>(V) * sizeof(float));
  }
  prof::Scope ps(prof::kAttnOut);
  linear_forward(o_, ctx, T, out, s.lin);
}

}  // namespace moe
