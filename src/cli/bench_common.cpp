#include "cli/bench_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "kernels/quant.h"
#include "moe/reference.h"

namespace moe::bench {

namespace {

struct ShapePreset {
  const char* name;
  int64_t hidden, inter, experts, topk, shared_inter;
};
// Layer shapes of public checkpoints (their config.json).
constexpr ShapePreset kShapes[] = {
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 0},
    {"qwen3-235b-a22b", 4096, 1536, 128, 8, 0},
    {"deepseek-v2-lite", 2048, 1408, 64, 6, 2816},  // 2 shared experts of 1408
    {"mixtral-8x7b", 4096, 14336, 8, 2, 0},
    {"qwen2-57b-a14b", 3584, 2560, 64, 8, 20480},
};

// splitmix64: fast, seedable, good enough to make random weights and inputs.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.f / 16777216.f) - 1.f; }  // [-1, 1)
};

// Rows [i0, i1) of `top` stacked on rows [i0, i1) of `bottom`, each [I, H].
Tensor gate_up_slice(const Tensor& w13, int64_t I, int64_t i0, int64_t i1) {
  const int64_t H = w13.dim(1), n = i1 - i0;
  Tensor out = Tensor::empty({2 * n, H}, DType::F32);
  std::memcpy(out.data<float>(), w13.data<float>() + i0 * H, n * H * 4);
  std::memcpy(out.data<float>() + n * H, w13.data<float>() + (I + i0) * H, n * H * 4);
  return out;
}

Tensor column_slice(const Tensor& w, int64_t c0, int64_t c1) {
  const int64_t R = w.dim(0), C = w.dim(1);
  Tensor out = Tensor::empty({R, c1 - c0}, DType::F32);
  for (int64_t r = 0; r < R; ++r) std::memcpy(out.data<float>() + r * (c1 - c0), w.data<float>() + r * C + c0, (c1 - c0) * 4);
  return out;
}

}  // namespace

std::vector<std::string> dtype_list(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

std::string shape_names() {
  std::string s = "custom";
  for (const auto& p : kShapes) s += std::string(", ") + p.name;
  return s;
}

bool is_shape(const std::string& name) {
  if (name == "custom") return true;
  for (const auto& p : kShapes)
    if (name == p.name) return true;
  return false;
}

MoeConfig bench_config(const BenchOptions& o) {
  MoeConfig cfg;
  cfg.model_type = "bench";
  cfg.n_layers = 1;
  if (o.shape == "custom") {
    MOE_CHECK(o.hidden > 0 && o.inter > 0 && o.experts > 0 && o.topk > 0,
              "--shape custom needs --hidden, --inter, --experts and --topk");
    cfg.hidden_size = o.hidden;
    cfg.moe_intermediate_size = o.inter;
    cfg.n_experts = o.experts;
    cfg.top_k = o.topk;
    cfg.shared_intermediate_size = o.shared_inter;
  } else {
    MOE_CHECK(o.hidden == 0 && o.inter == 0 && o.experts == 0 && o.topk == 0 && o.shared_inter < 0,
              "--hidden/--inter/--experts/--topk/--shared-inter need --shape custom (the preset '{}' fixes them)",
              o.shape);
    for (const auto& s : kShapes)
      if (o.shape == s.name) {
        cfg.hidden_size = s.hidden;
        cfg.moe_intermediate_size = s.inter;
        cfg.n_experts = s.experts;
        cfg.top_k = s.topk;
        cfg.shared_intermediate_size = s.shared_inter;
      }
  }
  cfg.shared_intermediate_size = std::max<int64_t>(cfg.shared_intermediate_size, 0);
  cfg.routing.scoring = Scoring::Softmax;
  cfg.routing.renormalize = true;
  cfg.validate();
  return cfg;
}

Tensor random_tensor(const Shape& shape, float scale, uint64_t seed, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  Rng r{seed};
  for (int64_t i = 0; i < n; ++i) p[i] = r.uniform() * scale;
  if (dtype == DType::BF16)
    for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
  return t;
}

Fp8Expert fp8_expert(const MoeConfig& cfg, int64_t e) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size;
  MOE_CHECK(H % kFp8Block == 0 && I % kFp8Block == 0,
            "--dtype fp8 needs hidden and intermediate sizes that are multiples of the {} block (got H={} I={})",
            kFp8Block, H, I);
  // Codes with exponent fields 5..8 (|v| in [0.25, 3.75]) and a random sign; block scales
  // around sqrt(3 / fan_in) / 2, so the weights look like the f32 ones (variance ~1/fan_in).
  auto codes = [](int64_t n, int64_t k, uint64_t seed) {
    Tensor t = Tensor::empty({n, k}, DType::F8E4M3);
    auto* p = static_cast<uint8_t*>(t.raw());
    Rng r{seed};
    for (int64_t i = 0; i < n * k; ++i) {
      const uint64_t b = r.next();
      p[i] = static_cast<uint8_t>((b & 0x80) | (5 + ((b >> 8) & 3)) << 3 | ((b >> 16) & 7));
    }
    return t;
  };
  auto scales = [](int64_t n, int64_t k, float base, uint64_t seed) {
    Tensor t = Tensor::empty({n / kFp8Block, k / kFp8Block}, DType::F32);
    Rng r{seed};
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = base * (1.0f + 0.25f * r.uniform());
    return t;
  };
  return {codes(2 * I, H, 300 + 2 * e), scales(2 * I, H, 0.5f * std::sqrt(3.f / H) / 1.5f, 400 + 2 * e),
          codes(H, I, 301 + 2 * e), scales(H, I, 0.5f * std::sqrt(3.f / I) / 1.5f, 401 + 2 * e)};
}

std::pair<Tensor, Tensor> expert_weights(const MoeConfig& cfg, int64_t e, DType dtype) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size;
  if (dtype == DType::F8E4M3) {  // the bf16 values the kernel computes with
    const Fp8Expert f = fp8_expert(cfg, e);
    return {dequantize_fp8_blocks(f.w13, f.s13, kFp8Block, kFp8Block, DType::BF16).to(DType::F32),
            dequantize_fp8_blocks(f.w2, f.s2, kFp8Block, kFp8Block, DType::BF16).to(DType::F32)};
  }
  // Uniform with scale sqrt(3 / fan_in) has variance 1 / fan_in: activations stay O(1).
  return {random_tensor({2 * I, H}, std::sqrt(3.f / H), 100 + 2 * e, dtype),
          random_tensor({H, I}, std::sqrt(3.f / I), 101 + 2 * e, dtype)};
}

DType bench_dtype(const std::string& name, int64_t group, int64_t* int4_group, std::optional<CodedFormat>* coded) {
  *int4_group = name == "int4" ? group : 0;
  // GGUF's symmetric types as moe-ep loads them: codes in groups of 32 with an f16 scale
  // and one zero point (gguf_types.cpp): Q8_0 in 8-bit codes, Q5_0 in 6-bit, Q4_0 in 4-bit.
  const std::optional<CodedFormat> f = name == "q8_0"   ? CodedFormat{32, 8, false, 1, 128}
                                       : name == "q5_0" ? CodedFormat{32, 6, false, 1, 16}
                                       : name == "q4_0" ? CodedFormat{32, 4, false, 1, 8}
                                                        : std::optional<CodedFormat>();
  if (f) {
    MOE_CHECK(coded, "--dtype {}: GGUF-coded experts are benchmarked by `moe-ep bench` alone", name);
    *coded = f;
    return DType::I8;
  }
  if (coded) coded->reset();
  return name == "int4" ? DType::I8 : parse_dtype(name);
}

namespace {
// w [n, k] f32 in format f (symmetric: one zero point z, an f16 scale per group of 32):
// d = f16(amax / (z - 1)), code = clamp(round(x / d) + z, 0, 2z - 1), as llama.cpp's Q8_0
// quantiser (z = 128) and close to its Q4_0 / Q5_0 ones (which take d from the signed
// extreme): random weights need only the format, not that quantiser's choice.
CodedWeight quantize_symmetric(const Tensor& w, const CodedFormat& f) {
  const int64_t n = w.dim(0), k = w.dim(1), ng = int4_n_groups(k, f.group), z = f.zero;
  CodedWeight c;
  c.u = Tensor::empty({n, k}, DType::U8);
  c.sb_d = Tensor::empty({n, ng}, DType::F16);
  c.zero = Tensor::empty({n, ng}, DType::U8);
  std::memset(c.zero.raw(), static_cast<int>(z), c.zero.nbytes());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < ng; ++g) {
      const float* x = w.data<float>() + r * k + g * f.group;
      const int64_t len = std::min(f.group, k - g * f.group);
      float amax = 0.f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
      const uint16_t h = f32_to_f16(amax / static_cast<float>(z - 1));
      c.sb_d.data<uint16_t>()[r * ng + g] = h;
      const float d = f16_to_f32(h);
      for (int64_t i = 0; i < len; ++i) {
        const float q = d > 0.f ? std::nearbyint(x[i] / d) : 0.f;
        c.u.data<uint8_t>()[r * k + g * f.group + i] =
            static_cast<uint8_t>(std::clamp<float>(q + static_cast<float>(z), 0.f, static_cast<float>(2 * z - 1)));
      }
    }
  return c;
}
}  // namespace

size_t expert_read_bytes(const MoeLayerWeights& w) {
  auto one = [](const PackedExperts& p) {
    if (p.int4_group > 0) return int4_bytes_per_expert(p);
    // FP8: the block scales are read with the codes (w_scale, about 6 % of the codes).
    return p.bytes_per_expert() +
           (p.dtype == DType::F8E4M3 ? p.w_scale.nbytes() / std::max<int64_t>(1, p.n_experts) : size_t{0});
  };
  return one(w.w13) + one(w.w2);
}

MoeLayerWeights random_layer(const MoeConfig& cfg, DType dtype, int64_t begin, int64_t end, int tp_rank, int tp,
                             int64_t int4_group, const CodedFormat* coded) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  MOE_CHECK(I % tp == 0, "--tp {} does not divide the intermediate size {}", tp, I);
  const int64_t Il = I / tp, i0 = tp_rank * Il;
  MoeLayerWeights w;
  w.expert_begin = begin;
  w.expert_end = end;
  w.gate = make_packed_experts(1, E, H, DType::F32, false);
  // Gate scale 4/sqrt(H): logits of a few units, so routing is far from uniform.
  pack_expert(w.gate, 0, random_tensor({E, H}, 4.f / std::sqrt(float(H)), 1));
  if (dtype == DType::F8E4M3) {
    MOE_CHECK(tp == 1, "--dtype fp8 with --tp > 1 is not supported (fp8 experts are not sliced for MoE-TP)");
    w.w13 = make_packed_experts_fp8(end - begin, 2 * I, H, true, kFp8Block);
    w.w2 = make_packed_experts_fp8(end - begin, H, I, false, kFp8Block);
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = begin; e < end; ++e) {
      const Fp8Expert f = fp8_expert(cfg, e);
      pack_expert_fp8(w.w13, e - begin, f.w13, f.s13, kFp8Block);
      pack_expert_fp8(w.w2, e - begin, f.w2, f.s2, kFp8Block);
    }
  } else if (coded) {
    MOE_CHECK(dtype == DType::I8, "GGUF-coded experts take int8 activations");
    w.w13 = make_packed_experts_coded(end - begin, 2 * Il, H, true, *coded);
    w.w2 = make_packed_experts_coded(end - begin, H, Il, false, *coded);
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = begin; e < end; ++e) {
      const auto [w13, w2] = expert_weights(cfg, e, DType::F32);
      pack_expert_coded(w.w13, e - begin, quantize_symmetric(tp == 1 ? w13 : gate_up_slice(w13, I, i0, i0 + Il), *coded));
      pack_expert_coded(w.w2, e - begin, quantize_symmetric(tp == 1 ? w2 : column_slice(w2, i0, i0 + Il), *coded));
    }
  } else {
    MOE_CHECK(int4_group == 0 || dtype == DType::I8, "int4 experts take int8 activations");
    w.w13 = int4_group > 0 ? make_packed_experts_int4(end - begin, 2 * Il, H, true, int4_group)
                           : make_packed_experts(end - begin, 2 * Il, H, dtype, true);
    w.w2 = int4_group > 0 ? make_packed_experts_int4(end - begin, H, Il, false, int4_group)
                          : make_packed_experts(end - begin, H, Il, dtype, false);
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = begin; e < end; ++e) {
      const auto [w13, w2] = expert_weights(cfg, e, DType::F32);
      pack_expert(w.w13, e - begin, tp == 1 ? w13 : gate_up_slice(w13, I, i0, i0 + Il));
      pack_expert(w.w2, e - begin, tp == 1 ? w2 : column_slice(w2, i0, i0 + Il));
    }
  }
  if (cfg.shared_intermediate_size > 0) {
    const int64_t S = cfg.shared_intermediate_size;
    GatedMlpWeights s;
    s.act = cfg.act;
    // W8A8 and FP8 benches: shared experts stay bf16.
    const DType sd = dtype == DType::I8 || dtype == DType::F8E4M3 ? DType::BF16 : dtype;
    s.w13 = make_packed_experts(1, 2 * S, H, sd, true);
    s.w2 = make_packed_experts(1, H, S, sd, false);
    pack_expert(s.w13, 0, random_tensor({2 * S, H}, std::sqrt(3.f / H), 7));
    pack_expert(s.w2, 0, random_tensor({H, S}, std::sqrt(3.f / S), 8));
    w.shared = std::move(s);
  }
  return w;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double max_over_ranks(Communicator& c, double v) {
  std::vector<double> all(c.size());
  c.all_gather(&v, sizeof v, all.data());
  return *std::max_element(all.begin(), all.end());
}

double parse_skew(const std::string& s) {
  if (s.empty()) return 0.0;
  MOE_CHECK(s.rfind("zipf:", 0) == 0, "--skew '{}': expected zipf:S (e.g. zipf:1.2)", s);
  char* end = nullptr;
  const double v = std::strtod(s.c_str() + 5, &end);
  MOE_CHECK(end && *end == 0 && s.size() > 5 && std::isfinite(v) && v >= 0 && v <= 8,
            "--skew '{}': S must be a number in [0, 8]", s);
  return v;
}

void skew_router(const MoeConfig& cfg, MoeLayerWeights& w, double s) {
  if (s <= 0) return;
  const int64_t E = cfg.n_experts, H = cfg.hidden_size;
  Tensor g = random_tensor({E, H}, 4.f / std::sqrt(float(H)), 1);  // random_layer's gate
  std::vector<int64_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  Rng r{0x5eed};
  for (int64_t i = E - 1; i > 0; --i) std::swap(order[i], order[static_cast<int64_t>(r.next() % (i + 1))]);
  constexpr double kBeta = 1.04;  // Gumbel scale with std 4/3: 4/3 * sqrt(6) / pi
  float* p = g.data<float>();
  for (int64_t rank = 0; rank < E; ++rank) {
    const int64_t e = order[rank];
    double mean = 0;
    for (int64_t h = 0; h < H; ++h) mean += p[e * H + h];
    mean /= H;
    const double b = -s * kBeta * std::log(double(rank) + 1.0);
    for (int64_t h = 0; h < H; ++h) p[e * H + h] = static_cast<float>(p[e * H + h] - mean + b / (H * kSkewOffset));
  }
  w.gate = make_packed_experts(1, E, H, DType::F32, false);
  pack_expert(w.gate, 0, g);
}

void skew_inputs(Tensor& x) {
  MOE_CHECK(x.dtype() == DType::F32 && x.is_contiguous(), "skew_inputs: f32 inputs");
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] += kSkewOffset;
}

std::string check_sample(const MoeConfig& cfg, const MoeLayerWeights& w, const Tensor& x, const Tensor& y, DType dtype,
                         bool* ok) {
  const Tensor ref =
      moe_reference(cfg, w, x, [&](int64_t e) { return expert_weights(cfg, e, dtype); });
  if (dtype == DType::I8) {
    // W8A8 / W4A8 against the f32 layer: quantisation error, not rounding order, so the
    // check is the cosine similarity of the outputs (the bound: >= 0.99; int4's
    // error is ~16x int8's per weight: 0.98, see docs/PERF_QUANT.md).
    const double bound = w.w13.int4_group > 0 ? 0.98 : 0.99;
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      const double a = y.data<float>()[i], b = ref.data<float>()[i];
      dot += a * b;
      na += a * a;
      nb += b * b;
    }
    const double cos = na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
    *ok = cos >= bound;
    return fmt::format("{} ({} tokens, cosine vs f32 {:.5f})", *ok ? "ok" : "FAILED", x.dim(0), cos);
  }
  // bf16: vLLM's CPU MoE bounds (the reference rounds like the kernels); f32: only
  // summation order differs.
  const bool bf16 = dtype == DType::BF16 || dtype == DType::F8E4M3;  // fp8: bf16 activations
  const double atol = bf16 ? 1e-3 : 1e-5, rtol = bf16 ? 1.6e-2 : 1e-4;
  double max_abs = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = std::fabs(double(y.data<float>()[i]) - ref.data<float>()[i]);
    max_abs = std::max(max_abs, d);
    if (!(d <= atol + rtol * std::fabs(ref.data<float>()[i]))) ++bad;
  }
  *ok = bad == 0;
  return fmt::format("{} ({} tokens, max|diff| {:.1e})", bad == 0 ? "ok" : "FAILED", x.dim(0), max_abs);
}

}  // namespace moe::bench
