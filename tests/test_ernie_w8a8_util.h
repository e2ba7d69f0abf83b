// An ERNIE-4.5 W8A8 checkpoint as FastDeploy stores it, written in the test from the
// float `ernie4_5_moe` fixture, and the test's own scalar model of it (no engine kernel,
// no engine loader): shared by tests/test_ernie_w8a8.cpp.
//
// The scalar model is the ERNIE-4.5-MoE decoder of transformers (RMSNorm, GQA with RoPE
// on interleaved pairs, softmax routing with the moe_statics bias for selection only,
// renormalised with a clamp, one shared expert, tied lm_head) in double precision. With
// float weights it is the reference of the fixture (its logits are checked against
// transformers' goldens) and the calibration run: it records the abs-max of every
// quantised input. With the checkpoint's int8 weights it is the static W8A8 model,
// each linear computed as
//   q_x = clamp(nearbyint(x / s_a), -127, 127)   s_a = activation_scale / 127 (f32)
//   y_n = (sum_k q_x[k] * q_w[k, n]) * s_a * s_w[n]   (int64 sum), s_w = weight_scale / 127
// and K (after RoPE) and V quantised with the cache steps (cachek/cachev_matmul
// activation_scale / 127) where they enter the cache, as an int8 KV cache would hold
// them. q_matmul / s_matmul scales are written (calibrated) but, as in the engine, not
// applied (loader/quant_weights.h AttentionQuantScales says why).
//
// Checkpoint names (FastDeploy, loader/scales.h): per layer
//   self_attn.qkv_proj.{weight i8 [H, (nh + 2 nkv) hd], weight_scale [out], activation_scale [1]}
//   self_attn.o_proj.{weight i8 [nh hd, H], weight_scale [H], activation_scale [1]}
//   self_attn.{cachek,cachev,q,s}_matmul.activation_scale [1]
//   mlp.up_gate_proj / mlp.down_proj (dense layer 0), mlp.shared_experts.{up_gate,down}_proj,
//   mlp.experts.{e}.{up_gate,down}_proj (+ mlp.experts.up_gate_proj.activation_scale, one
//   for all experts; experts.{e}.down_proj.activation_scale per expert)
// Weight abs-max per output channel; activation abs-max over the calibration prompts
// (routed experts: every calibration token through every expert, so none is left
// without a value).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "loader/safetensors.h"
#include "test_quant_formats_util.h"
#include "test_util.h"

namespace moe::test::ernie {

inline constexpr const char* kFixture = "ernie4_5_moe";
// The fixture's shapes (tests/fixtures/ernie4_5_moe/config.json).
inline constexpr int64_t kH = 32, kHeads = 4, kKv = 2, kHd = 8, kLayers = 3, kE = 12, kTopK = 3, kV = 96;
inline constexpr int64_t kDenseI = 48, kMoeI = 16;
inline constexpr double kEps = 1e-5, kTheta = 500000.0, kNormMin = 1e-12;

using Vec = std::vector<double>;

// One linear [out, in]: float weights, or int8 codes with steps.
struct Lin {
  int64_t out = 0, in = 0;
  bool int8 = false;
  Vec w;                    // float: [out, in]
  std::vector<int8_t> q;    // int8: [out, in]
  std::vector<float> ws;    // int8: per output channel step (f32, as stored / 127)
  float as = 0;             // int8: static input step
  Vec operator()(const Vec& x) const {
    Vec y(out, 0.0);
    if (!int8) {
      for (int64_t n = 0; n < out; ++n)
        for (int64_t k = 0; k < in; ++k) y[n] += w[n * in + k] * x[k];
      return y;
    }
    std::vector<int32_t> xq(in);
    for (int64_t k = 0; k < in; ++k)
      xq[k] = static_cast<int32_t>(std::clamp(std::nearbyint(static_cast<float>(x[k]) / as), -127.f, 127.f));
    for (int64_t n = 0; n < out; ++n) {
      int64_t acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += static_cast<int64_t>(xq[k]) * q[n * in + k];
      y[n] = static_cast<double>(acc) * as * ws[n];
    }
    return y;
  }
};

struct Mlp {  // gated: ug = [gate rows; up rows] [2I, H], dn [H, I]
  Lin ug, dn;
};

struct Layer {
  Vec in_norm, post_norm;
  Lin qkv, o;                // qkv: [q; k; v] rows
  float cache_k = 0, cache_v = 0;  // int8 model: the cache steps
  bool moe = false;
  Mlp dense, shared;
  Vec router, bias;          // [E, H], [E]
  std::vector<Mlp> experts;
};

struct Model {
  Vec embed, final_norm;  // [V, H], [H]
  std::vector<Layer> layers;
};

// Abs-max of every quantised input, by name ("L.qkv", "L.o", "L.k", "L.v", "L.q", "L.s",
// "L.mlp.ug", "L.mlp.dn", "L.shared.ug", "L.shared.dn", "L.experts.ug", "L.experts.E.dn").
struct Calib {
  std::map<std::string, double> amax;
  void see(const std::string& name, const Vec& v, int64_t b = 0, int64_t e = -1) {
    double& a = amax[name];
    for (int64_t i = b; i < (e < 0 ? static_cast<int64_t>(v.size()) : e); ++i) a = std::max(a, std::fabs(v[i]));
  }
};

inline Vec rms(const Vec& x, const Vec& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + kEps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * (x[i] * r);
  return y;
}

inline double silu(double a) { return a / (1.0 + std::exp(-a)); }

inline Vec run_mlp(const Mlp& m, const Vec& x, Calib* c, const std::string& name) {
  if (c) c->see(name + ".ug", x);
  const Vec gu = m.ug(x);
  const int64_t I = m.ug.out / 2;
  Vec h(I);
  for (int64_t i = 0; i < I; ++i) h[i] = silu(gu[i]) * gu[I + i];
  if (c) c->see(name + ".dn", h);
  return m.dn(h);
}

// Interleaved RoPE on one head vector of kHd at position p.
inline void rope(double* v, int64_t p) {
  for (int64_t i = 0; i < kHd / 2; ++i) {
    const double f = std::pow(kTheta, -2.0 * static_cast<double>(i) / kHd), a = p * f;
    const double x1 = v[2 * i], x2 = v[2 * i + 1];
    v[2 * i] = x1 * std::cos(a) - x2 * std::sin(a);
    v[2 * i + 1] = x2 * std::cos(a) + x1 * std::sin(a);
  }
}

inline double fake_quant(double x, float step) {
  return std::clamp(std::nearbyint(static_cast<float>(x) / step), -127.f, 127.f) * static_cast<double>(step);
}

// Logits [S, V] of one prompt (causal, all positions).
inline std::vector<Vec> forward(const Model& m, const std::vector<int32_t>& ids, Calib* c = nullptr) {
  const int64_t S = static_cast<int64_t>(ids.size()), nq = kHeads * kHd, nkv = kKv * kHd;
  std::vector<Vec> h(S, Vec(kH));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < kH; ++i) h[s][i] = m.embed[ids[s] * kH + i];
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const Layer& L = m.layers[l];
    const std::string n = std::to_string(l);
    std::vector<Vec> q(S), k(S), v(S);
    for (int64_t s = 0; s < S; ++s) {
      const Vec x = rms(h[s], L.in_norm);
      if (c) c->see(n + ".qkv", x);
      const Vec y = L.qkv(x);
      q[s].assign(y.begin(), y.begin() + nq);
      k[s].assign(y.begin() + nq, y.begin() + nq + nkv);
      v[s].assign(y.begin() + nq + nkv, y.end());
      for (int64_t hh = 0; hh < kHeads; ++hh) rope(q[s].data() + hh * kHd, s);
      for (int64_t hh = 0; hh < kKv; ++hh) rope(k[s].data() + hh * kHd, s);
      if (c) {
        c->see(n + ".q", q[s]);
        c->see(n + ".k", k[s]);
        c->see(n + ".v", v[s]);
      }
      if (L.cache_k > 0)
        for (int64_t i = 0; i < nkv; ++i) {
          k[s][i] = fake_quant(k[s][i], L.cache_k);
          v[s][i] = fake_quant(v[s][i], L.cache_v);
        }
    }
    for (int64_t s = 0; s < S; ++s) {
      Vec ctx(nq, 0.0);
      for (int64_t hh = 0; hh < kHeads; ++hh) {
        const int64_t g = hh / (kHeads / kKv);
        Vec sc(s + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= s; ++j) {
          double d = 0;
          for (int64_t i = 0; i < kHd; ++i) d += q[s][hh * kHd + i] * k[j][g * kHd + i];
          sc[j] = d / std::sqrt(static_cast<double>(kHd));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (double& e : sc) sum += (e = std::exp(e - mx));
        for (double& e : sc) e /= sum;
        if (c) c->see(n + ".s", sc);
        for (int64_t j = 0; j <= s; ++j)
          for (int64_t i = 0; i < kHd; ++i) ctx[hh * kHd + i] += sc[j] * v[j][g * kHd + i];
      }
      if (c) c->see(n + ".o", ctx);
      const Vec o = L.o(ctx);
      for (int64_t i = 0; i < kH; ++i) h[s][i] += o[i];
    }
    for (int64_t s = 0; s < S; ++s) {
      const Vec x = rms(h[s], L.post_norm);
      Vec y(kH, 0.0);
      if (!L.moe) {
        y = run_mlp(L.dense, x, c, n + ".mlp");
      } else {
        Vec p(kE);
        double mx = -1e300;
        for (int64_t e = 0; e < kE; ++e) {
          double d = 0;
          for (int64_t i = 0; i < kH; ++i) d += L.router[e * kH + i] * x[i];
          mx = std::max(mx, p[e] = d);
        }
        double sum = 0;
        for (double& e : p) sum += (e = std::exp(e - mx));
        for (double& e : p) e /= sum;
        std::vector<int64_t> order(kE);
        for (int64_t e = 0; e < kE; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return p[a] + L.bias[a] > p[b] + L.bias[b]; });
        double wsum = 0;
        for (int64_t j = 0; j < kTopK; ++j) wsum += p[order[j]];
        for (int64_t j = 0; j < kTopK; ++j) {
          const Vec oe = run_mlp(L.experts[order[j]], x, nullptr, "");
          const double wt = p[order[j]] / std::max(wsum, kNormMin);
          for (int64_t i = 0; i < kH; ++i) y[i] += wt * oe[i];
        }
        if (c)  // every expert on every calibration token: every expert gets a value
          for (int64_t e = 0; e < kE; ++e) {
            Calib one;
            run_mlp(L.experts[e], x, &one, "x");
            c->amax[n + ".experts.ug"] = std::max(c->amax[n + ".experts.ug"], one.amax["x.ug"]);
            double& d = c->amax[n + ".experts." + std::to_string(e) + ".dn"];
            d = std::max(d, one.amax["x.dn"]);
          }
        const Vec sh = run_mlp(L.shared, x, c, n + ".shared");
        for (int64_t i = 0; i < kH; ++i) y[i] += sh[i];
      }
      for (int64_t i = 0; i < kH; ++i) h[s][i] += y[i];
    }
  }
  std::vector<Vec> logits(S, Vec(kV, 0.0));
  for (int64_t s = 0; s < S; ++s) {
    const Vec x = rms(h[s], m.final_norm);
    for (int64_t t = 0; t < kV; ++t)
      for (int64_t i = 0; i < kH; ++i) logits[s][t] += m.embed[t * kH + i] * x[i];
  }
  return logits;
}

// ---- loading the scalar model --------------------------------------------------------

inline Vec vec_of(const Tensor& t) {
  const Tensor f = t.to(DType::F32);
  return Vec(f.data<float>(), f.data<float>() + f.numel());
}

inline Lin float_lin(const std::vector<Tensor>& rows) {  // stacked [out, in] blocks
  Lin l;
  l.in = rows[0].dim(1);
  for (const Tensor& r : rows) {
    const Vec v = vec_of(r);
    l.w.insert(l.w.end(), v.begin(), v.end());
    l.out += r.dim(0);
  }
  return l;
}

// The fixture as the float scalar model.
inline Model float_model() {
  auto f = SafetensorsFile::open(fixtures_dir() + "/" + kFixture + "/model.safetensors");
  auto t = [&](const std::string& k) { return f->view(k); };
  Model m;
  m.embed = vec_of(t("model.embed_tokens.weight"));
  m.final_norm = vec_of(t("model.norm.weight"));
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.in_norm = vec_of(t(p + "input_layernorm.weight"));
    L.post_norm = vec_of(t(p + "post_attention_layernorm.weight"));
    L.qkv = float_lin({t(p + "self_attn.q_proj.weight"), t(p + "self_attn.k_proj.weight"), t(p + "self_attn.v_proj.weight")});
    L.o = float_lin({t(p + "self_attn.o_proj.weight")});
    auto mlp = [&](const std::string& b) {
      return Mlp{float_lin({t(b + "gate_proj.weight"), t(b + "up_proj.weight")}), float_lin({t(b + "down_proj.weight")})};
    };
    L.moe = l > 0;
    if (!L.moe) {
      L.dense = mlp(p + "mlp.");
    } else {
      L.router = vec_of(t(p + "mlp.gate.weight"));
      L.bias = vec_of(t(p + "mlp.moe_statics.e_score_correction_bias"));
      L.shared = mlp(p + "mlp.shared_experts.");
      for (int64_t e = 0; e < kE; ++e) L.experts.push_back(mlp(p + "mlp.experts." + std::to_string(e) + "."));
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}

// ---- the W8A8 checkpoint ---------------------------------------------------------------

// Random calibration prompts (ids in [0, V)), fixed seed.
inline std::vector<std::vector<int32_t>> calibration_prompts() {
  std::mt19937 rng(4242);
  std::uniform_int_distribution<int32_t> id(0, kV - 1);
  std::vector<std::vector<int32_t>> out;
  for (int n : {12, 9, 16, 5}) {
    std::vector<int32_t> p(n);
    for (int32_t& v : p) v = id(rng);
    out.push_back(p);
  }
  return out;
}

inline Calib calibrate(const Model& fm) {
  Calib c;
  for (const auto& p : calibration_prompts()) forward(fm, p, &c);
  return c;
}

inline Tensor scalar_f32(double v) {
  Tensor t = Tensor::empty({1}, DType::F32);
  t.data<float>()[0] = static_cast<float>(v);
  return t;
}

// An [out, in] float linear as FastDeploy's int8 [in, out] weight and abs-max scale.
inline void put_int8(Tensors& ts, const std::string& prefix, const Lin& l, double act_amax) {
  std::vector<float> w(l.w.begin(), l.w.end());
  std::vector<int8_t> q(l.out * l.in);
  std::vector<float> step(l.out);
  quantize_rows_test(w.data(), l.out, l.in, q.data(), step.data());
  Tensor qt = Tensor::empty({l.in, l.out}, DType::I8), amax = Tensor::empty({l.out}, DType::F32);
  for (int64_t n = 0; n < l.out; ++n) {
    double a = 0;
    for (int64_t k = 0; k < l.in; ++k) {
      qt.data<int8_t>()[k * l.out + n] = q[n * l.in + k];
      a = std::max(a, std::fabs(static_cast<double>(w[n * l.in + k])));
    }
    amax.data<float>()[n] = static_cast<float>(a);
  }
  ts.emplace_back(prefix + ".weight", qt);
  ts.emplace_back(prefix + ".weight_scale", amax);
  ts.emplace_back(prefix + ".activation_scale", scalar_f32(act_amax));
}

// The whole W8A8 checkpoint's tensors (float: embeddings, norms, routers, biases).
inline Tensors w8a8_tensors(const Model& fm, const Calib& c) {
  auto f = SafetensorsFile::open(fixtures_dir() + "/" + kFixture + "/model.safetensors");
  Tensors ts;
  for (const TensorInfo& ti : f->tensors()) {
    const std::string& k = ti.name;
    if (k.find("_proj.weight") != std::string::npos) continue;  // every linear is rewritten below
    ts.emplace_back(k, f->view(k).to(DType::F32));
  }
  auto amax = [&](const std::string& n) { return c.amax.at(n); };
  for (int64_t l = 0; l < kLayers; ++l) {
    const Layer& L = fm.layers[l];
    const std::string n = std::to_string(l), p = "model.layers." + n + ".";
    put_int8(ts, p + "self_attn.qkv_proj", L.qkv, amax(n + ".qkv"));
    put_int8(ts, p + "self_attn.o_proj", L.o, amax(n + ".o"));
    ts.emplace_back(p + "self_attn.cachek_matmul.activation_scale", scalar_f32(amax(n + ".k")));
    ts.emplace_back(p + "self_attn.cachev_matmul.activation_scale", scalar_f32(amax(n + ".v")));
    ts.emplace_back(p + "self_attn.q_matmul.activation_scale", scalar_f32(amax(n + ".q")));
    ts.emplace_back(p + "self_attn.s_matmul.activation_scale", scalar_f32(amax(n + ".s")));
    if (!L.moe) {
      put_int8(ts, p + "mlp.up_gate_proj", L.dense.ug, amax(n + ".mlp.ug"));
      put_int8(ts, p + "mlp.down_proj", L.dense.dn, amax(n + ".mlp.dn"));
      continue;
    }
    put_int8(ts, p + "mlp.shared_experts.up_gate_proj", L.shared.ug, amax(n + ".shared.ug"));
    put_int8(ts, p + "mlp.shared_experts.down_proj", L.shared.dn, amax(n + ".shared.dn"));
    for (int64_t e = 0; e < kE; ++e) {
      const std::string b = p + "mlp.experts." + std::to_string(e);
      put_int8(ts, b + ".up_gate_proj", L.experts[e].ug, 0);
      erase_tensor(ts, b + ".up_gate_proj.activation_scale");  // one for all experts, below
      put_int8(ts, b + ".down_proj", L.experts[e].dn, amax(n + ".experts." + std::to_string(e) + ".dn"));
    }
    ts.emplace_back(p + "mlp.experts.up_gate_proj.activation_scale", scalar_f32(amax(n + ".experts.ug")));
  }
  return ts;
}

// ---- the int8 scalar model, from a written checkpoint's tensors ------------------------

inline Lin int8_lin(SafetensorsFile& f, const std::string& prefix, float act_amax_override = -1) {
  const Tensor qt = f.view(prefix + ".weight");  // [in, out]
  Lin l;
  l.int8 = true;
  l.in = qt.dim(0);
  l.out = qt.dim(1);
  l.q.resize(l.out * l.in);
  for (int64_t k = 0; k < l.in; ++k)
    for (int64_t n = 0; n < l.out; ++n) l.q[n * l.in + k] = qt.data<int8_t>()[k * l.out + n];
  const Tensor ws = f.view(prefix + ".weight_scale").to(DType::F32);
  for (int64_t n = 0; n < l.out; ++n) l.ws.push_back(ws.data<float>()[n] / 127.0f);
  l.as = (act_amax_override >= 0 ? act_amax_override : f.view(prefix + ".activation_scale").to(DType::F32).data<float>()[0]) /
         127.0f;
  return l;
}

inline Model int8_model(const std::string& dir) {
  auto f = SafetensorsFile::open(dir + "/model.safetensors");
  auto t = [&](const std::string& k) { return f->view(k); };
  auto scalar = [&](const std::string& k) { return t(k).to(DType::F32).data<float>()[0]; };
  Model m;
  m.embed = vec_of(t("model.embed_tokens.weight"));
  m.final_norm = vec_of(t("model.norm.weight"));
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.in_norm = vec_of(t(p + "input_layernorm.weight"));
    L.post_norm = vec_of(t(p + "post_attention_layernorm.weight"));
    L.qkv = int8_lin(*f, p + "self_attn.qkv_proj");
    L.o = int8_lin(*f, p + "self_attn.o_proj");
    L.cache_k = scalar(p + "self_attn.cachek_matmul.activation_scale") / 127.0f;
    L.cache_v = scalar(p + "self_attn.cachev_matmul.activation_scale") / 127.0f;
    L.moe = l > 0;
    if (!L.moe) {
      L.dense = Mlp{int8_lin(*f, p + "mlp.up_gate_proj"), int8_lin(*f, p + "mlp.down_proj")};
    } else {
      L.router = vec_of(t(p + "mlp.gate.weight"));
      L.bias = vec_of(t(p + "mlp.moe_statics.e_score_correction_bias"));
      L.shared = Mlp{int8_lin(*f, p + "mlp.shared_experts.up_gate_proj"), int8_lin(*f, p + "mlp.shared_experts.down_proj")};
      const float a1 = scalar(p + "mlp.experts.up_gate_proj.activation_scale");
      for (int64_t e = 0; e < kE; ++e) {
        const std::string b = p + "mlp.experts." + std::to_string(e);
        L.experts.push_back(Mlp{int8_lin(*f, b + ".up_gate_proj", a1), int8_lin(*f, b + ".down_proj")});
      }
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}

}  // namespace moe::test::ernie
