#include "moe/reference.h"

#include <cmath>
#include <map>
#include <vector>

#include "core/check.h"
#include "kernels/routing.h"

namespace moe {

namespace {

std::vector<float> row_f32(const Tensor& x, int64_t t) {
  const int64_t H = x.dim(1);
  std::vector<float> r(H);
  const char* base = static_cast<const char*>(x.raw()) + t * H * dtype_size(x.dtype());
  convert_to_f32(base, x.dtype(), r.data(), H);
  return r;
}

// down(act(gate . x) * (up . x)) for one row, with unpacked f32 weights w13 [2I, H], w2 [H, I].
std::vector<double> mlp_row(const float* w13, const float* w2, int64_t H, int64_t I, Activation act, bool bf16,
                            const std::vector<float>& xin) {
  std::vector<float> x = xin;
  if (bf16)
    for (float& v : x) v = round_bf16(v);
  std::vector<float> h(I);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t c = 0; c < H; ++c) {
      g += static_cast<double>(w13[i * H + c]) * x[c];
      u += static_cast<double>(w13[(I + i) * H + c]) * x[c];
    }
    const float v = act_gate(act, static_cast<float>(g)) * static_cast<float>(u);
    h[i] = bf16 ? round_bf16(v) : v;
  }
  std::vector<double> y(H);
  for (int64_t r = 0; r < H; ++r) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += static_cast<double>(w2[r * I + i]) * h[i];
    y[r] = s;
  }
  return y;
}

}  // namespace

Tensor gated_mlp_reference(const GatedMlpWeights& w, const Tensor& x) {
  const int64_t T = x.dim(0), H = w.w13.k, I = w.w13.n_out();
  const Tensor w13 = unpack_expert(w.w13, 0), w2 = unpack_expert(w.w2, 0);
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  for (int64_t t = 0; t < T; ++t) {
    const auto r = mlp_row(w13.data<float>(), w2.data<float>(), H, I, w.act, w.w13.act_dtype() == DType::BF16, row_f32(x, t));
    for (int64_t h = 0; h < H; ++h) y.data<float>()[t * H + h] = static_cast<float>(r[h]);
  }
  return y;
}

Tensor moe_reference(const MoeConfig& cfg, const MoeLayerWeights& w, const Tensor& x, const ExpertWeightsFn& experts) {
  const int64_t T = x.dim(0), H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts,
                k = cfg.top_k;
  MOE_CHECK(experts || (w.expert_begin == 0 && w.expert_end == E && w.w13.n == 2 * I),
            "moe_reference needs all experts' full weights (or an ExpertWeightsFn)");
  const bool bf16 = w.w13.act_dtype() == DType::BF16;
  const Tensor gate = unpack_expert(w.gate, 0);  // [E, H]
  std::vector<float> logits(T * E);
  for (int64_t t = 0; t < T; ++t) {
    const auto xr = row_f32(x, t);
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += static_cast<double>(gate.data<float>()[e * H + h]) * xr[h];
      logits[t * E + e] = static_cast<float>(s);
    }
  }
  std::vector<float> weights(T * k);
  std::vector<int32_t> ids(T * k);
  RoutingParams rp;
  rp.cfg = cfg.routing;
  rp.n_tokens = T;
  rp.n_experts = E;
  rp.top_k = k;
  rp.logits = logits.data();
  rp.correction_bias = w.correction_bias.defined() ? w.correction_bias.data<float>() : nullptr;
  rp.weights = weights.data();
  rp.ids = ids.data();
  if (T > 0) route_reference(rp);

  std::map<int32_t, std::pair<Tensor, Tensor>> unpacked;  // only the experts used
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  Tensor shared = w.shared ? gated_mlp_reference(*w.shared, x) : Tensor();
  for (int64_t t = 0; t < T; ++t) {
    const auto xr = row_f32(x, t);
    std::vector<double> acc(H, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      auto it = unpacked.find(e);
      if (it == unpacked.end())
        it = unpacked.emplace(e, experts ? experts(e) : std::make_pair(unpack_expert(w.w13, e), unpack_expert(w.w2, e)))
                 .first;
      const auto r = mlp_row(it->second.first.data<float>(), it->second.second.data<float>(), H, I, cfg.act, bf16, xr);
      for (int64_t h = 0; h < H; ++h) acc[h] += weights[t * k + j] * r[h];
    }
    if (w.shared) {
      double s = 1.0;
      if (cfg.shared_expert_gate) {
        double dot = 0;
        for (int64_t h = 0; h < H; ++h) dot += static_cast<double>(w.shared_gate.data<float>()[h]) * xr[h];
        s = 1.0 / (1.0 + std::exp(-dot));
      }
      for (int64_t h = 0; h < H; ++h) acc[h] += s * shared.data<float>()[t * H + h];
    }
    for (int64_t h = 0; h < H; ++h) y.data<float>()[t * H + h] = static_cast<float>(acc[h]);
  }
  return y;
}

}  // namespace moe
