// ERNIE-4.5 static W8A8 as FastDeploy stores it (loader/quant_weights.h): the whole
// model from a checkpoint written in the test (test_ernie_w8a8_util.h) whose every
// linear layer is int8 (fused qkv_proj, o_proj, the dense MLP, the shared and routed
// experts) with calibrated static activation scales and int8 KV cache scales.
//   - The test's scalar model reproduces transformers' logits of the float fixture
//     (so it is a faithful ERNIE), and its int8 form is the reference of the engine.
//   - The engine's prefill logits equal the scalar int8 model's within a tolerance
//     (below), its greedy tokens equal the reference's, and its logits stay within
//     cosine 0.99 of the f32 engine's.
//   - Hostile variants: missing, non-finite, <= 0 or mis-shaped scales and weights give
//     errors naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "loader/checkpoint.h"
#include "loader/quant_weights.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_ernie_w8a8_util.h"
#include "test_model_util.h"
#include "test_quant_util.h"

namespace moe {
namespace {

namespace er = test::ernie;

// The W8A8 checkpoint, written once per test binary run.
const std::string& w8a8_dir() {
  static test::TempDir dir;
  static const bool written = [] {
    const er::Model fm = er::float_model();
    test::write_checkpoint(dir.path(), er::kFixture, er::w8a8_tensors(fm, er::calibrate(fm)));
    return true;
  }();
  (void)written;
  return dir.path();
}

const test::ModelFixture& fixture() {
  static const test::ModelFixture f = [] {
    for (const auto& m : test::model_fixtures())
      if (m.name == er::kFixture) return m;
    throw Error("no ernie4_5_moe fixture");
  }();
  return f;
}

TEST(ErnieW8A8, ScalarModelReproducesTransformers) {
  const er::Model fm = er::float_model();
  const test::ModelFixture& f = fixture();
  const int64_t S = f.logits.dim(1), V = f.logits.dim(2);
  double worst = 0;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    const auto lg = er::forward(fm, f.prompts[i]);
    for (size_t s = 0; s < lg.size(); ++s)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::fabs(lg[s][v] - f.logits.data<float>()[(i * S + s) * V + v]));
  }
  // transformers ran in f32, this model in f64: f32 rounding of logits of size ~10.
  EXPECT_LT(worst, 1e-3);
  std::printf("[ ernie w8a8 ] scalar f64 model vs transformers: max |diff| %.3g\n", worst);
}

TEST(ErnieW8A8, CheckpointHasTheFastDeployNamesAndNoFloatLinear) {
  Checkpoint ck = Checkpoint::open(w8a8_dir());
  EXPECT_EQ(ck.info("model.layers.0.self_attn.qkv_proj.weight").dtype, DType::I8);
  EXPECT_EQ(ck.info("model.layers.0.self_attn.qkv_proj.weight").shape, (Shape{er::kH, (er::kHeads + 2 * er::kKv) * er::kHd}));
  EXPECT_EQ(ck.info("model.layers.0.mlp.up_gate_proj.weight").shape, (Shape{er::kH, 2 * er::kDenseI}));
  EXPECT_EQ(ck.info("model.layers.1.mlp.shared_experts.down_proj.weight").dtype, DType::I8);
  for (const std::string& k : ck.keys()) EXPECT_EQ(k.find("q_proj"), std::string::npos) << k;
  // The generator's own size bound (the task's: < 300 KB).
  std::ifstream in(w8a8_dir() + "/model.safetensors", std::ios::ate | std::ios::binary);
  EXPECT_LT(static_cast<int64_t>(in.tellg()), 300 * 1000);
}

struct EngineRun {
  Tensor logits;  // [3, 9, V]
  std::vector<std::vector<int32_t>> greedy;
};

EngineRun run_engine(const std::string& dir, DType dt) {
  auto m = test::load_model(dir, dt);
  EngineRun r;
  r.logits = prefill_logits(*m, fixture().prompts);
  GenerateOptions g;
  g.max_new_tokens = 8;
  g.ignore_eos = true;
  r.greedy = generate(*m, fixture().prompts, g).tokens;
  return r;
}

// Greedy tokens of the scalar model (recomputing the whole prefix each step).
std::vector<int32_t> scalar_greedy(const er::Model& m, std::vector<int32_t> seq, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const auto lg = er::forward(m, seq);
    const auto& last = lg.back();
    const int32_t t = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

TEST(ErnieW8A8, WholeModelEqualsTheScalarStaticModel) {
  const er::Model qm = er::int8_model(w8a8_dir());
  const test::ModelFixture& f = fixture();
  const int64_t S = f.logits.dim(1), V = f.logits.dim(2);
  // Every linear of the checkpoint is int8 whatever --dtype says; only the lm_head (tied
  // to the float embeddings) computes in --dtype, so bf16 adds its rounding (2^-9 of the
  // weights and of the input, relative).
  for (DType dt : {DType::F32, DType::BF16}) {
    const EngineRun e = run_engine(w8a8_dir(), dt);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < f.prompts.size(); ++i) {
      const auto lg = er::forward(qm, f.prompts[i]);
      for (size_t s = 0; s < lg.size(); ++s)
        for (int64_t v = 0; v < V; ++v) {
          worst = std::max(worst, std::fabs(lg[s][v] - e.logits.data<float>()[(i * S + s) * V + v]));
          scale = std::max(scale, std::fabs(lg[s][v]));
        }
      EXPECT_EQ(e.greedy[i], scalar_greedy(qm, f.prompts[i], 8)) << "prompt " << i;
    }
    // Exact integer products; what differs is f32 (engine) against f64 (reference)
    // around them, and an input that lands within an ulp of a rounding boundary of x / s
    // moves by one code in one of the two: bounded by a small fraction of the logits.
    EXPECT_LT(worst, (dt == DType::F32 ? 1e-3 : 4e-3) * scale) << dtype_name(dt);
    std::printf("[ ernie w8a8 ] %s engine vs scalar static W8A8 model: max |diff| %.3g (max |logit| %.3g)\n",
                dtype_name(dt), worst, scale);
  }
}

TEST(ErnieW8A8, WholeModelIsCloseToF32) {
  const test::ModelFixture& f = fixture();
  const EngineRun q = run_engine(w8a8_dir(), DType::F32), fp = run_engine(f.dir, DType::F32);
  const int64_t S = f.logits.dim(1), V = f.logits.dim(2);
  double worst = 1;
  for (size_t i = 0; i < f.prompts.size(); ++i)
    for (size_t s = 0; s < f.prompts[i].size(); ++s) {
      const int64_t row = (static_cast<int64_t>(i) * S + static_cast<int64_t>(s)) * V;
      worst = std::min(worst, test::cosine(q.logits.data<float>() + row, fp.logits.data<float>() + row, V));
    }
  EXPECT_GE(worst, 0.99);
  EXPECT_GT(test::max_logit_diff(q.logits, fp.logits, f.prompts), 0.0);  // int8 really ran
  for (size_t i = 0; i < f.prompts.size(); ++i) EXPECT_EQ(q.greedy[i], fp.greedy[i]) << "prompt " << i;
  std::printf("[ ernie w8a8 ] engine W8A8 vs f32 prefill logits: worst cosine %.6f\n", worst);
}

// ---- hostile variants ------------------------------------------------------------------

using Edit = std::function<void(test::Tensors&)>;

void expect_model_error(const Edit& edit, const std::vector<std::string>& needles) {
  const er::Model fm = er::float_model();
  test::Tensors ts = er::w8a8_tensors(fm, er::calibrate(fm));
  edit(ts);
  test::TempDir dir;
  test::write_checkpoint(dir.path(), er::kFixture, ts);
  try {
    test::load_model(dir.path());
    ADD_FAILURE() << "no error for " << needles[0];
  } catch (const Error& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

Edit erase(const std::string& key) {
  return [=](test::Tensors& ts) {
    ASSERT_TRUE(test::find_tensor(ts, key)) << key;
    test::erase_tensor(ts, key);
  };
}

Edit set(const std::string& key, Tensor v) {
  return [=](test::Tensors& ts) {
    Tensor* t = test::find_tensor(ts, key);
    ASSERT_TRUE(t) << key;
    *t = v;
  };
}

Tensor f32s(std::vector<float> v, Shape s) {
  Tensor t = Tensor::empty(s, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

TEST(ErnieW8A8, MissingActivationScaleNamesIt) {
  for (const char* k : {"model.layers.0.self_attn.qkv_proj.activation_scale", "model.layers.2.self_attn.o_proj.activation_scale",
                        "model.layers.0.mlp.down_proj.activation_scale",
                        "model.layers.1.mlp.shared_experts.up_gate_proj.activation_scale"})
    expect_model_error(erase(k), {k, "missing", "activation scale"});
  expect_model_error(erase("model.layers.1.self_attn.cachev_matmul.activation_scale"),
                     {"model.layers.1.self_attn.cachev_matmul.activation_scale",
                      "model.layers.1.self_attn.cachek_matmul.activation_scale", "both or neither"});
}

TEST(ErnieW8A8, NonFiniteOrNonPositiveScalesNameTheTensor) {
  const std::string p = "model.layers.1.";
  expect_model_error(set(p + "self_attn.qkv_proj.activation_scale", f32s({0.f}, {1})),
                     {p + "self_attn.qkv_proj.activation_scale", "must be finite and > 0"});
  expect_model_error(set(p + "self_attn.o_proj.activation_scale", f32s({-2.f}, {1})),
                     {p + "self_attn.o_proj.activation_scale", "-2"});
  expect_model_error(set(p + "self_attn.cachek_matmul.activation_scale", f32s({INFINITY}, {1})),
                     {p + "self_attn.cachek_matmul.activation_scale", "inf"});
  expect_model_error(set(p + "self_attn.s_matmul.activation_scale", f32s({NAN}, {1})),
                     {p + "self_attn.s_matmul.activation_scale", "nan"});
  std::vector<float> ws(64, 1.f);
  ws[5] = NAN;
  expect_model_error(set(p + "self_attn.qkv_proj.weight_scale", f32s(ws, {64})),
                     {p + "self_attn.qkv_proj.weight_scale", "nan", "index 5"});
  std::vector<float> ds(er::kH, 1.f);
  ds[0] = 0.f;
  expect_model_error(set("model.layers.0.mlp.down_proj.weight_scale", f32s(ds, {er::kH})),
                     {"model.layers.0.mlp.down_proj.weight_scale", "must be finite and > 0"});
}

TEST(ErnieW8A8, WrongShapesNameTheTensor) {
  const std::string p = "model.layers.2.";
  expect_model_error(set(p + "self_attn.qkv_proj.weight_scale", f32s(std::vector<float>(63, 1.f), {63})),
                     {p + "self_attn.qkv_proj.weight_scale", "[63]", "[64]"});
  expect_model_error(set(p + "self_attn.qkv_proj.activation_scale", f32s({1.f, 2.f}, {2})),
                     {p + "self_attn.qkv_proj.activation_scale", "[2]", "[1]"});
  expect_model_error(set(p + "self_attn.cachek_matmul.activation_scale", f32s(std::vector<float>(5, 1.f), {5})),
                     {p + "self_attn.cachek_matmul.activation_scale", "[5]", "[16]"});
  expect_model_error(set(p + "self_attn.o_proj.weight", Tensor::zeros({er::kH, 33}, DType::I8)),
                     {p + "self_attn.o_proj.weight", "[32, 33]", "[32, 32]"});
  expect_model_error(set(p + "mlp.shared_experts.down_proj.weight", Tensor::zeros({er::kMoeI, er::kH}, DType::F32)),
                     {p + "mlp.shared_experts.down_proj.weight", "dtype f32", "i8"});
}

}  // namespace
}  // namespace moe
