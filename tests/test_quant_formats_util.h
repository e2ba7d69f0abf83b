// Pre-quantised checkpoints written from a fixture's float weights, shared by
// tests/test_quant_formats.cpp and tests/mpi/test_quant_formats_ep.cpp.
//
// The quantisation here is the test's own (double precision, round half away from
// zero), independent of the engine's kernels/quant.cpp, and follows each format's
// conventions as loader/quant_weights.h documents them:
//   xLLM SmoothQuant: activation multiplied by `smooth` m before quantisation, so the
//     stored weight is quantise(W[n, k] / m[k]) with w ~= q * per_channel_scale.
//   FastDeploy static W8A8: weight_scale and activation_scale are abs-max values
//     (step = value / 127); weights stored in Paddle's [in, out] layout.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "loader/safetensors.h"
#include "test_util.h"

namespace moe::test {

using Tensors = std::vector<std::pair<std::string, Tensor>>;

// Every tensor of a single-file fixture, as f32 (owned).
inline Tensors fixture_tensors(const std::string& name) {
  auto f = SafetensorsFile::open(fixtures_dir() + "/" + name + "/model.safetensors");
  Tensors out;
  for (const TensorInfo& ti : f->tensors()) out.emplace_back(ti.name, f->view(ti.name).to(DType::F32));
  return out;
}

inline void write_checkpoint(const std::string& dir, const std::string& fixture, const Tensors& ts) {
  std::ifstream in(fixtures_dir() + "/" + fixture + "/config.json");
  std::ofstream(dir + "/config.json") << in.rdbuf();
  write_safetensors(dir + "/model.safetensors", ts);
}

inline Tensor* find_tensor(Tensors& ts, const std::string& key) {
  for (auto& [k, t] : ts)
    if (k == key) return &t;
  return nullptr;
}
inline void erase_tensor(Tensors& ts, const std::string& key) {
  std::erase_if(ts, [&](const auto& p) { return p.first == key; });
}

// Symmetric int8 per row of w [n, k]: step = amax / 127, q = round-half-away(w / step).
inline void quantize_rows_test(const float* w, int64_t n, int64_t k, int8_t* q, float* step) {
  for (int64_t r = 0; r < n; ++r) {
    double amax = 0;
    for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(double(w[r * k + j])));
    const double s = amax > 0 ? amax / 127.0 : 1.0;
    step[r] = static_cast<float>(s);
    for (int64_t j = 0; j < k; ++j)
      q[r * k + j] = static_cast<int8_t>(std::clamp<long long>(std::llround(w[r * k + j] / s), -127, 127));
  }
}

// Per-input-channel smooth multipliers in [0.5, 2), none equal to 1.
inline Tensor smooth_multipliers(int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  Tensor m = Tensor::empty({k}, DType::F32);
  for (int64_t i = 0; i < k; ++i) {
    float v = u(rng);
    m.data<float>()[i] = v == 1.0f ? 1.25f : v;
  }
  return m;
}

// Expert projection of a float expert key "<block>.experts.<e>.<proj>.weight" of `layer`:
// 0 gate (gate_proj, w1), 1 up (up_proj, w3), 2 down (down_proj, w2); -1 otherwise.
inline int expert_proj(const std::string& key, int64_t layer, int64_t* expert, std::string* base) {
  const std::string L = "model.layers." + std::to_string(layer) + ".";
  if (!key.starts_with(L) || !key.ends_with(".weight")) return -1;
  const size_t at = key.find(".experts.");
  if (at == std::string::npos) return -1;
  const std::string rest = key.substr(at + 9);  // "<e>.<proj>.weight"
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || dot == 0 || rest.find_first_not_of("0123456789") != dot) return -1;
  *expert = std::stoll(rest.substr(0, dot));
  const std::string proj = rest.substr(dot + 1, rest.size() - dot - 1 - 7);
  *base = key.substr(0, key.size() - 7);
  if (proj == "gate_proj" || proj == "w1") return 0;
  if (proj == "up_proj" || proj == "w3") return 1;
  if (proj == "down_proj" || proj == "w2") return 2;
  return -1;
}

// An xLLM SmoothQuant copy of `fixture`: layer `layer`'s routed experts replaced by
// qweight / per_channel_scale / smooth. GEMM1's smooth is stored under up_proj for every
// expert and also under gate_proj (equal) for even experts; down_proj gets its own.
// gate's per_channel_scale is [I, 1] (the other layout), the others [out].
inline Tensors smoothquant_tensors(const std::string& fixture, int64_t layer) {
  Tensors in = fixture_tensors(fixture), out;
  std::map<int64_t, Tensor> m13;  // GEMM1 smooth multiplier per expert
  for (auto& [key, w] : in) {
    int64_t e = -1;
    std::string base;
    const int proj = expert_proj(key, layer, &e, &base);
    if (proj < 0) {
      out.emplace_back(key, w);
      continue;
    }
    const int64_t n = w.dim(0), k = w.dim(1);
    if (proj < 2 && !m13.count(e)) m13[e] = smooth_multipliers(k, 1000 + e);
    const Tensor m = proj < 2 ? m13[e] : smooth_multipliers(k, 5000 + e);
    Tensor ws = w.clone();  // W / m, column-wise
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k; ++j) ws.data<float>()[r * k + j] /= m.data<float>()[j];
    Tensor q = Tensor::empty({n, k}, DType::I8);
    Tensor s = Tensor::empty(proj == 0 ? Shape{n, 1} : Shape{n}, DType::F32);
    quantize_rows_test(ws.data<float>(), n, k, q.data<int8_t>(), s.data<float>());
    out.emplace_back(base + ".qweight", q);
    out.emplace_back(base + ".per_channel_scale", s);
    if (proj == 1 || proj == 2 || e % 2 == 0) out.emplace_back(base + ".smooth", m.clone());
  }
  return out;
}

// Abs-max of act(gate) * up (silu) of every expert of a float layer over calibration
// rows xc [T, H]; gate/up [I, H] per expert.
inline float silu_mul_absmax(const float* g, const float* u, int64_t I, int64_t H, const Tensor& xc) {
  double amax = 0;
  for (int64_t t = 0; t < xc.dim(0); ++t)
    for (int64_t i = 0; i < I; ++i) {
      double a = 0, b = 0;
      for (int64_t h = 0; h < H; ++h) {
        a += double(g[i * H + h]) * xc.data<float>()[t * H + h];
        b += double(u[i * H + h]) * xc.data<float>()[t * H + h];
      }
      amax = std::max(amax, std::fabs(a / (1.0 + std::exp(-a)) * b));
    }
  return static_cast<float>(amax);
}

// A FastDeploy static-W8A8 copy of `fixture` (an ERNIE family fixture): layer `layer`'s
// routed experts replaced by int8 up_gate_proj / down_proj in Paddle layout [in, out]
// with abs-max weight_scale, one shared up_gate_proj activation_scale and one
// down_proj activation_scale per expert, calibrated on `calib` [T, H] (abs-max over all
// rows through every expert).
inline Tensors static_w8a8_tensors(const std::string& fixture, int64_t layer, const Tensor& calib) {
  Tensors in = fixture_tensors(fixture), out;
  std::map<int64_t, std::map<int, Tensor>> experts;  // e -> proj -> float weight
  std::string block;
  for (auto& [key, w] : in) {
    int64_t e = -1;
    std::string base;
    const int proj = expert_proj(key, layer, &e, &base);
    if (proj < 0) {
      out.emplace_back(key, w);
      continue;
    }
    experts[e][proj] = w;
    block = base.substr(0, base.find(".experts.") + 9);  // "...mlp.experts."
  }
  float a1 = 0;
  for (int64_t i = 0; i < calib.numel(); ++i) a1 = std::max(a1, std::fabs(calib.data<float>()[i]));
  out.emplace_back(block + "up_gate_proj.activation_scale", Tensor::empty({1}, DType::F32));
  out.back().second.data<float>()[0] = a1;
  auto absmax_int8_transposed = [](const Tensor& w, Tensor& qt, Tensor& amax) {
    const int64_t n = w.dim(0), k = w.dim(1);
    std::vector<int8_t> q(n * k);
    std::vector<float> step(n);
    quantize_rows_test(w.data<float>(), n, k, q.data(), step.data());
    qt = Tensor::empty({k, n}, DType::I8);  // Paddle [in, out]
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k; ++j) qt.data<int8_t>()[j * n + r] = q[r * k + j];
    amax = Tensor::empty({n}, DType::F32);
    for (int64_t r = 0; r < n; ++r) {
      double a = 0;
      for (int64_t j = 0; j < k; ++j) a = std::max(a, std::fabs(double(w.data<float>()[r * k + j])));
      amax.data<float>()[r] = static_cast<float>(a);
    }
  };
  for (auto& [e, p] : experts) {
    const Tensor& g = p[0];
    const Tensor& u = p[1];
    const int64_t I = g.dim(0), H = g.dim(1);
    Tensor gu = Tensor::empty({2 * I, H}, DType::F32);
    std::memcpy(gu.raw(), g.raw(), g.nbytes());
    std::memcpy(static_cast<char*>(gu.raw()) + g.nbytes(), u.raw(), u.nbytes());
    Tensor q, a;
    const std::string eb = block + std::to_string(e) + ".";
    absmax_int8_transposed(gu, q, a);
    out.emplace_back(eb + "up_gate_proj.weight", q);
    out.emplace_back(eb + "up_gate_proj.weight_scale", a);
    absmax_int8_transposed(p[2], q, a);
    out.emplace_back(eb + "down_proj.weight", q);
    out.emplace_back(eb + "down_proj.weight_scale", a);
    Tensor a2 = Tensor::empty({1}, DType::F32);
    a2.data<float>()[0] = silu_mul_absmax(g.data<float>(), u.data<float>(), I, H, calib);
    out.emplace_back(eb + "down_proj.activation_scale", a2);
  }
  return out;
}

}  // namespace moe::test
