// Every family's golden fixture from Hugging Face transformers, through the C++
// API and through `moe-ep layer`, in f32 and bf16.
//
// The fixtures' weights and inputs are exactly representable in bf16 (see
// tests/fixtures/README.md), so the fp32 transformers output is a tight reference
// for the bf16 path too: only the kernels' bf16 rounding of the GEMM1 output differs.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/config.h"
#include "moe/fused_moe.h"
#include "moe/reference.h"
#include "test_util.h"

namespace moe {
namespace {

using nlohmann::json;

struct FixtureCase {
  std::string fixture, dir, input, output, routing, prefix;
  int64_t layer, tokens;
  bool moe;
  double margin;  // smallest gap between the k-th and (k+1)-th choice score (transformers)
};

std::vector<FixtureCase> all_cases() {
  std::vector<FixtureCase> out;
  for (const json& f : test::manifest()) {
    for (const json& c : f["cases"]) {
      FixtureCase fc;
      fc.fixture = f["name"];
      fc.dir = test::fixtures_dir() + "/" + f["name"].get<std::string>();
      fc.input = test::fixtures_dir() + "/" + c["input"].get<std::string>();
      fc.output = test::fixtures_dir() + "/" + c["output"].get<std::string>();
      fc.layer = c["layer"];
      fc.tokens = c["tokens"];
      fc.moe = c["kind"] == "moe";
      if (fc.moe && c.contains("routing")) {
        fc.routing = test::fixtures_dir() + "/" + c["routing"].get<std::string>();
        fc.prefix = c["routing_prefix"];
      }
      fc.margin = c.contains("route_margin") && c["route_margin"].is_number() ? c["route_margin"].get<double>() : 1.0;
      out.push_back(fc);
    }
  }
  return out;
}

Tensor golden(const std::string& path) { return SafetensorsFile::open(path)->view("hidden_states").clone(); }

// Runs the case through the C++ API; also returns the plain reference on the same
// loaded weights (which rounds to bf16 exactly where the kernels do).
Tensor run_api(const FixtureCase& c, DType dt, Routing* routing = nullptr, Tensor* reference = nullptr) {
  Checkpoint ck = Checkpoint::open(c.dir);
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  EXPECT_EQ(cfg.is_moe_layer(c.layer), c.moe) << "layer kind disagrees with transformers";
  const Tensor x = golden(c.input);
  if (!c.moe) {
    Tensor y = Tensor::zeros({x.dim(0), cfg.hidden_size}, DType::F32);
    MoeScratch s;
    const GatedMlpWeights w = load_dense_mlp(ck, cfg, c.layer, dt);
    run_gated_mlp(w, x, y.data<float>(), s);
    if (reference) *reference = gated_mlp_reference(w, x);
    return y;
  }
  MlpLoadOptions lo;
  lo.compute = dt;
  MoeLayer layer(cfg, load_moe_layer(ck, cfg, c.layer, lo));
  if (routing) layer.route(x, *routing);
  if (reference) *reference = moe_reference(cfg, layer.weights(), x);
  return layer.forward(x);
}

// bf16 against the fp32 golden: the kernels round each GEMM1 output to bf16 (relative
// error <= 2^-9), which moves an output by up to ~2^-9 of the sum of |terms| feeding
// it; near-zero outputs are sums of larger terms, so the bound is relative to the
// output scale: 1.6e-2 * |ref| + 1e-2 * max|ref|.
test::Tolerance bf16_vs_golden(const Tensor& ref) {
  double scale = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, double(std::fabs(ref.data<float>()[i])));
  return {1e-2 * scale + 1e-6, 1.6e-2};
}

TEST(Fixtures, ManifestCoversEveryFamilyAndLayout) {
  std::set<std::string> types, layouts;
  bool sharded = false, bf16 = false;
  for (const json& f : test::manifest()) {
    types.insert(f["model_type"].get<std::string>());
    layouts.insert(f["layout"].get<std::string>());
    sharded |= f["sharded"].get<bool>();
    bf16 |= f["weights_dtype"] == "bfloat16";
  }
  EXPECT_EQ(types, (std::set<std::string>{"qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v2", "deepseek_v3",
                                          "ernie4_5_moe"}));
  EXPECT_EQ(layouts, (std::set<std::string>{"per_expert", "fused"}));
  EXPECT_TRUE(sharded);
  EXPECT_TRUE(bf16);
  EXPECT_GT(all_cases().size(), 60u);
}

TEST(Fixtures, RoutingMatchesTransformers) {
  int checked = 0;
  for (const FixtureCase& c : all_cases()) {
    if (c.routing.empty() || c.tokens == 0) continue;
    SCOPED_TRACE(c.fixture + " layer " + std::to_string(c.layer) + " T=" + std::to_string(c.tokens));
    Routing r;
    run_api(c, DType::F32, &r);
    auto file = SafetensorsFile::open(c.routing);
    const Tensor ids = file->view(c.prefix + "topk_ids");  // i64 [T, k]
    const Tensor w = file->view(c.prefix + "topk_weights").to(DType::F32);
    const int64_t k = ids.dim(1);
    // A near-tie closer than f32 rounding of the router logits may flip; the
    // fixtures record their smallest margin, and all of ours are well above 1e-5.
    ASSERT_GT(c.margin, 1e-5);
    for (int64_t t = 0; t < c.tokens; ++t) {
      std::multiset<int64_t> want, got;
      for (int64_t j = 0; j < k; ++j) {
        want.insert(ids.data<int64_t>()[t * k + j]);
        got.insert(r.ids[t * k + j]);
      }
      ASSERT_EQ(got, want) << "token " << t;
      for (int64_t j = 0; j < k; ++j) {
        // Same expert, same weight (transformers may order equal picks differently).
        for (int64_t jj = 0; jj < k; ++jj)
          if (ids.data<int64_t>()[t * k + jj] == r.ids[t * k + j]) {
            EXPECT_NEAR(r.weights[t * k + j], w.data<float>()[t * k + jj], 1e-6);
          }
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

class FixtureApi : public ::testing::TestWithParam<DType> {};

TEST_P(FixtureApi, EveryCaseMatchesGolden) {
  const DType dt = GetParam();
  for (const FixtureCase& c : all_cases()) {
    SCOPED_TRACE(c.fixture + " layer " + std::to_string(c.layer) + " T=" + std::to_string(c.tokens));
    Tensor ref;
    const Tensor y = run_api(c, dt, nullptr, &ref);
    const Tensor gold = golden(c.output);
    if (dt == DType::F32) {
      EXPECT_TRUE(test::all_close(y, gold, test::kF32Tol));
      EXPECT_TRUE(test::all_close(ref, gold, test::kF32Tol)) << "the plain reference disagrees with transformers";
    } else {
      // vLLM's bound against a reference that rounds like the kernel, and the
      // documented bf16 bound against transformers' fp32 output.
      EXPECT_TRUE(test::all_close(y, ref, test::kBf16Tol));
      EXPECT_TRUE(test::all_close(y, gold, bf16_vs_golden(gold)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FixtureApi, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class FixtureCli : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureCli, EveryCaseMatchesGolden) {
  const std::string dtype = GetParam();
  test::TempDir tmp;
  for (const FixtureCase& c : all_cases()) {
    SCOPED_TRACE(c.fixture + " layer " + std::to_string(c.layer) + " T=" + std::to_string(c.tokens));
    const std::string out = tmp / "out.safetensors";
    std::string log;
    const int rc = test::run_command(std::string(MOE_EP_BINARY) + " layer --quiet --model " + c.dir + " --layer " +
                                         std::to_string(c.layer) + " --input " + c.input + " --output " + out +
                                         " --dtype " + dtype,
                                     &log);
    ASSERT_EQ(rc, 0) << log;
    auto file = SafetensorsFile::open(out);
    const Tensor y = file->view("hidden_states");
    EXPECT_EQ(y.dtype(), DType::F32);
    const Tensor gold = golden(c.output);
    EXPECT_TRUE(test::all_close(y, gold, dtype == "f32" ? test::kF32Tol : bf16_vs_golden(gold)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FixtureCli, ::testing::Values("f32", "bf16"));

}  // namespace
}  // namespace moe
