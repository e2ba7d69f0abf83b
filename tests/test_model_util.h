// Helpers for the whole-model tests: the golden prompts, logits and greedy tokens of
// every fixture (tests/fixtures/README.md), and loading a model for a test.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "loader/safetensors.h"
#include "model/model.h"
#include "test_util.h"

namespace moe::test {

struct ModelFixture {
  std::string name, dir;
  std::vector<std::vector<int32_t>> prompts;  // the 3 golden prompts (lengths 1, 5, 9)
  Tensor logits;                              // [3, 9, V] f32 golden (transformers)
  std::vector<std::vector<int32_t>> greedy;   // 16 greedy tokens per prompt
  std::vector<double> min_margin;             // smallest top-1/top-2 gap per prompt
};

// GoogleTest prints a parameter with this (test names and failure messages).
inline void PrintTo(const ModelFixture& f, std::ostream* os) { *os << f.name; }

inline std::vector<ModelFixture> model_fixtures() {
  std::vector<ModelFixture> out;
  for (const auto& f : manifest()) {
    if (!f.contains("logits")) continue;
    ModelFixture m;
    m.name = f["name"];
    m.dir = fixtures_dir() + "/" + m.name;
    auto file = SafetensorsFile::open(fixtures_dir() + "/" + f["logits"].get<std::string>());
    const Tensor ids = file->view("input_ids").clone(), len = file->view("lengths").clone();
    m.logits = file->view("logits").clone();
    for (int64_t b = 0; b < ids.dim(0); ++b) {
      std::vector<int32_t> p;
      for (int64_t s = 0; s < len.data<int64_t>()[b]; ++s) p.push_back(static_cast<int32_t>(ids.data<int64_t>()[b * ids.dim(1) + s]));
      m.prompts.push_back(p);
    }
    std::ifstream in(fixtures_dir() + "/" + f["greedy"].get<std::string>());
    const auto g = nlohmann::json::parse(in);
    for (const auto& p : g["prompts"]) {
      m.greedy.push_back(p["generated"].get<std::vector<int32_t>>());
      double mn = 1e30;
      for (double v : p["top2_margin"]) mn = std::min(mn, v);
      m.min_margin.push_back(mn);
    }
    out.push_back(std::move(m));
  }
  return out;
}

// Max |a - b| over the valid rows of logits [B, S, V] (rows < length of each prompt).
inline double max_logit_diff(const Tensor& a, const Tensor& b, const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t S = a.dim(1), V = a.dim(2), Sb = b.dim(1);
  double m = 0;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (size_t s = 0; s < prompts[i].size(); ++s)
      for (int64_t v = 0; v < V; ++v)
        m = std::max(m, static_cast<double>(std::fabs(a.data<float>()[(i * S + s) * V + v] -
                                                      b.data<float>()[(i * Sb + s) * V + v])));
  return m;
}

// The smallest cosine similarity of a's and b's logit rows over the valid rows of [B, S,
// V] logits (both the same S): how far a quantised model's answers drift from its float one.
inline double worst_logit_cosine(const Tensor& a, const Tensor& b, const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t S = a.dim(1), V = a.dim(2);
  double worst = 1;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t s = 0; s < static_cast<int64_t>(prompts[i].size()); ++s) {
      double ab = 0, aa = 0, bb = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double x = a.data<float>()[(i * S + s) * V + v], y = b.data<float>()[(i * S + s) * V + v];
        ab += x * y, aa += x * x, bb += y * y;
      }
      worst = std::min(worst, ab / std::sqrt(aa * bb));
    }
  return worst;
}

// bf16 logits against the fp32 golden: rows (prompt, position) whose max |difference|
// exceeds `frac` of the golden's largest |logit|, and the worst difference of the others.
struct Bf16Rows {
  int outliers = 0;
  double worst = 0, worst_in = 0, scale = 0;
};
inline Bf16Rows bf16_rows(const Tensor& got, const Tensor& golden, const std::vector<std::vector<int32_t>>& prompts,
                          double frac = 0.02) {
  Bf16Rows r;
  const int64_t S = got.dim(1), V = got.dim(2), Sg = golden.dim(1);
  for (int64_t i = 0; i < golden.numel(); ++i) r.scale = std::max(r.scale, (double)std::fabs(golden.data<float>()[i]));
  for (size_t i = 0; i < prompts.size(); ++i)
    for (size_t s = 0; s < prompts[i].size(); ++s) {
      double d = 0;
      for (int64_t v = 0; v < V; ++v)
        d = std::max(d, (double)std::fabs(got.data<float>()[(i * S + s) * V + v] -
                                          golden.data<float>()[(i * Sg + s) * V + v]));
      r.worst = std::max(r.worst, d);
      if (d > frac * r.scale) ++r.outliers;
      else r.worst_in = std::max(r.worst_in, d);
    }
  return r;
}

inline std::unique_ptr<Model> load_model(const std::string& dir, DType dt = DType::F32, int64_t n_slots = 3,
                                         int64_t max_seq = 32) {
  ModelOptions o;
  o.dtype = dt;
  o.n_slots = n_slots;
  o.max_seq = max_seq;
  return Model::load(dir, o);
}

}  // namespace moe::test
