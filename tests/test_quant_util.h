// W8A8 test layers shared by tests/test_quant_layer.cpp and tests/mpi/test_quant_ep.cpp:
// random routed experts quantised at pack time, optionally with a distinct smooth vector
// per expert (GEMM1 and GEMM2), built from per-expert seeds so that every rank builds
// the same expert e.
#pragma once

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/grouped_gemm.h"
#include "moe/config.h"
#include "moe/fused_moe.h"

namespace moe::test {

inline Tensor seeded(const Shape& shape, float scale, uint64_t seed, float offset = 0.f, bool positive = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(rng);
    t.data<float>()[i] = offset + (positive ? std::fabs(v) : v);
  }
  return t;
}

inline MoeConfig w8a8_config(int64_t H, int64_t I, int64_t E, int64_t k, int64_t shared_I = 0) {
  MoeConfig cfg;
  cfg.model_type = "test";
  cfg.n_layers = 1;
  cfg.hidden_size = H;
  cfg.moe_intermediate_size = I;
  cfg.n_experts = E;
  cfg.top_k = k;
  cfg.shared_intermediate_size = shared_I;
  cfg.routing.scoring = Scoring::Softmax;
  cfg.routing.renormalize = true;
  cfg.validate();
  return cfg;
}

// Experts [begin, end) of a W8A8 layer; smooth: per-expert smooth vectors in [0.5, ~2].
inline MoeLayerWeights w8a8_layer(const MoeConfig& cfg, int64_t begin, int64_t end, bool smooth) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  MoeLayerWeights w;
  w.expert_begin = begin;
  w.expert_end = end;
  w.gate = make_packed_experts(1, E, H, DType::F32, false);
  pack_expert(w.gate, 0, seeded({E, H}, 2.f / std::sqrt(float(H)), 1));
  w.w13 = make_packed_experts(end - begin, 2 * I, H, DType::I8, true);
  w.w2 = make_packed_experts(end - begin, H, I, DType::I8, false);
  if (smooth) {
    w.smooth_all = Tensor::empty({E, H}, DType::F32);
    for (int64_t e = 0; e < E; ++e) {
      const Tensor s = seeded({H}, 0.5f, 5000 + e, 0.5f, true);
      std::memcpy(w.smooth_all.data<float>() + e * H, s.raw(), H * 4);
    }
  }
  for (int64_t e = begin; e < end; ++e) {
    if (smooth) {
      set_expert_smooth(w.w13, e - begin, w.smooth_all.slice_rows(e, e + 1).reshape({H}));
      set_expert_smooth(w.w2, e - begin, seeded({I}, 0.5f, 6000 + e, 0.5f, true));
    }
    pack_expert(w.w13, e - begin, seeded({2 * I, H}, 1.f / std::sqrt(float(H)), 100 + 2 * e));
    pack_expert(w.w2, e - begin, seeded({H, I}, 1.f / std::sqrt(float(I)), 101 + 2 * e));
  }
  if (cfg.shared_intermediate_size > 0) {
    const int64_t S = cfg.shared_intermediate_size;
    GatedMlpWeights s;
    s.act = cfg.act;
    s.w13 = make_packed_experts(1, 2 * S, H, DType::BF16, true);
    s.w2 = make_packed_experts(1, H, S, DType::BF16, false);
    pack_expert(s.w13, 0, seeded({2 * S, H}, 1.f / std::sqrt(float(H)), 7));
    pack_expert(s.w2, 0, seeded({H, S}, 1.f / std::sqrt(float(S)), 8));
    w.shared = std::move(s);
  }
  return w;
}

// Cosine similarity of two f32 vectors of n values (1 when both are zero).
inline double cosine(const float* a, const float* b, int64_t n) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  return na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
}
inline double cosine(const Tensor& a, const Tensor& b) { return cosine(a.data<float>(), b.data<float>(), a.numel()); }

}  // namespace moe::test
