// Whole models with W8A8 routed experts (ModelOptions::quantize_w8a8; `forward`,
// `generate`, `bench-model --quantize w8a8`) against the same model in fp32, for every
// fixture (9 models of 6 families, tests/fixtures):
//   * prefill logits: cosine similarity >= 0.99 with the fp32 logits at every prompt
//     position (the bound), except where a routing decision flips (the
//     position's token goes to another expert in some layer: shown, and at most one
//     position per fixture; test_quant_model_util.h);
//   * greedy decoding, 8 steps: the tokens of both are printed with how many match (they
//     need not: the quantisation error may flip a near-tied argmax). While the two
//     generations agree the steps see the same context, so there every step's logits
//     (KV-cached decode) keep the cosine bound, and a step whose fp32 top-1/top-2 gap
//     exceeds twice the largest logit difference must pick the same token;
//   * the CLI's --quantize w8a8 writes exactly the API's logits and tokens.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "loader/safetensors.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_quant_model_util.h"

namespace moe {
namespace {

using test::ModelFixture;

std::unique_ptr<Model> load(const std::string& dir, bool w8a8, DType dtype = DType::F32) {
  ModelOptions o;
  o.dtype = dtype;
  o.quantize_w8a8 = w8a8;
  o.n_slots = 3;
  o.max_seq = 32;
  return Model::load(dir, o);
}

// "1,2,3"
std::string joined(const std::vector<int32_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }

class QuantModel : public ::testing::TestWithParam<ModelFixture> {};

std::string fixture_name(const ::testing::TestParamInfo<ModelFixture>& i) { return i.param.name; }

TEST_P(QuantModel, PrefillLogitsCosineVsFp32) {
  const ModelFixture& f = GetParam();
  auto fp = load(f.dir, false), q8 = load(f.dir, true);
  const Tensor lf = prefill_logits(*fp, f.prompts), lq = prefill_logits(*q8, f.prompts);
  ASSERT_EQ(lq.shape(), lf.shape());
  const test::CosineBound b = test::check_prefill_cosines(*fp, *q8, f.prompts, lf, lq);
  for (const std::string& flip : b.flips) std::printf("[ w8a8 model ] %-16s %s\n", f.name.c_str(), flip.c_str());
  // Routing flips are rare: at most one position per fixture (as in the bf16 test).
  EXPECT_LE(b.flips.size(), 1u);
  const double diff = test::max_logit_diff(lq, lf, f.prompts);
  // The routed experts really ran in int8: the logits moved.
  EXPECT_GT(diff, 0.0);
  std::printf("[ w8a8 model ] %-16s prefill logits vs fp32: worst cosine %.6f over %d positions (%.6f without "
              "routing flips; %zu flip(s)), max |diff| %.3g\n",
              f.name.c_str(), b.worst, b.positions, b.worst_same_routing, b.flips.size(), diff);
}

TEST_P(QuantModel, GreedyFirst8StepsVsFp32) {
  const ModelFixture& f = GetParam();
  constexpr int64_t kSteps = 8;
  GenerateOptions go;
  go.max_new_tokens = kSteps;
  go.ignore_eos = true;
  go.keep_logits = true;
  auto fp = load(f.dir, false), q8 = load(f.dir, true);
  const GenerateResult rf = generate(*fp, f.prompts, go), rq = generate(*q8, f.prompts, go);
  const int64_t V = fp->config().vocab_size;
  int match = 0, total = 0;
  test::CosineBound cb;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    const auto &tf = rf.tokens[i], &tq = rq.tokens[i];
    ASSERT_EQ(tf.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(tq.size(), static_cast<size_t>(kSteps));
    int m = 0, first_diff = -1;
    for (int64_t s = 0; s < kSteps; ++s) {
      m += tf[s] == tq[s];
      if (tf[s] != tq[s] && first_diff < 0) first_diff = static_cast<int>(s);
    }
    // Steps up to the first difference ran on the same context in both models.
    const int64_t same_ctx = first_diff < 0 ? kSteps : first_diff + 1;
    for (int64_t s = 0; s < same_ctx; ++s) {
      const float* a = rq.step_logits[i].data() + s * V;
      const float* b = rf.step_logits[i].data() + s * V;
      std::vector<int32_t> seq = f.prompts[i];
      seq.insert(seq.end(), tf.begin(), tf.begin() + s);  // the step's context
      test::check_cosine_bound(*fp, *q8, seq, test::cosine(a, b, V), fmt::format("prompt {} step {}", i, s), cb);
      double d = 0, top1 = -1e30, top2 = -1e30;
      for (int64_t v = 0; v < V; ++v) {
        d = std::max(d, static_cast<double>(std::fabs(a[v] - b[v])));
        if (b[v] > top1) {
          top2 = top1;
          top1 = b[v];
        } else if (b[v] > top2) {
          top2 = b[v];
        }
      }
      // |logit change| <= d everywhere cannot reorder a top-1/top-2 gap above 2d.
      if (top1 - top2 > 2 * d) {
        EXPECT_EQ(tq[s], tf[s]) << "prompt " << i << " step " << s;
      }
    }
    std::printf("[ w8a8 model ] %-16s prompt %zu: fp32 [%s] w8a8 [%s]: %d/%ld match%s\n", f.name.c_str(), i,
                joined(tf).c_str(), joined(tq).c_str(), m, long(kSteps),
                first_diff < 0 ? "" : (", first difference at step " + std::to_string(first_diff)).c_str());
    match += m;
    total += kSteps;
  }
  for (const std::string& flip : cb.flips) std::printf("[ w8a8 model ] %-16s %s\n", f.name.c_str(), flip.c_str());
  EXPECT_LE(cb.flips.size(), 1u);
  std::printf("[ w8a8 model ] %-16s greedy, first %ld steps: %d/%d tokens match fp32\n", f.name.c_str(), long(kSteps),
              match, total);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantModel, ::testing::ValuesIn(test::model_fixtures()), fixture_name);

// `moe-ep forward/generate --quantize w8a8` run the API's W8A8 model: the same logits bit
// for bit and the same tokens (bf16 here, so the shared experts and attention run bf16
// next to the int8 routed experts), with --warmup too.
TEST(QuantModelCli, ForwardAndGenerateMatchTheApi) {
  test::TempDir tmp;
  int n = 0;
  for (const ModelFixture& f : test::model_fixtures()) {
    if (f.name != "qwen2_moe" && f.name != "deepseek_v3") continue;  // shared experts; MLA and a dense layer
    SCOPED_TRACE(f.name);
    std::string ids;
    for (const auto& p : f.prompts) ids += (ids.empty() ? "" : ";") + joined(p);
    auto cli = [&](const std::string& verb, const std::string& flags) {
      std::string log;
      const int rc = test::run_command(std::string(MOE_EP_BINARY) + " " + verb + " --quiet --model " + f.dir +
                                           " --prompt-ids '" + ids + "' --dtype bf16 --quantize w8a8 " + flags,
                                       &log);
      EXPECT_EQ(rc, 0) << log;
      return rc == 0;
    };
    const std::string logits_path = tmp / "logits.safetensors", json_path = tmp / "gen.json";
    ASSERT_TRUE(cli("forward", "--logits " + logits_path));
    ASSERT_TRUE(cli("generate", "--max-new-tokens 8 --ignore-eos --kv-cache-dtype f32 --output-json " + json_path));
    // --warmup generates once untimed first; the timed run reuses the KV slots from position 0.
    const std::string warm_path = tmp / "warm.json";
    ASSERT_TRUE(cli("generate", "--warmup --max-new-tokens 8 --ignore-eos --kv-cache-dtype f32 --output-json " + warm_path));

    auto m = load(f.dir, true, DType::BF16);
    const Tensor want = prefill_logits(*m, f.prompts);
    const Tensor got = SafetensorsFile::open(logits_path)->view("logits").clone();
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));

    GenerateOptions go;
    go.max_new_tokens = 8;
    go.ignore_eos = true;
    auto m2 = load(f.dir, true, DType::BF16);
    const GenerateResult r = generate(*m2, f.prompts, go);
    std::ifstream in(json_path);
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["quantize"], "w8a8");
    EXPECT_EQ(j["generated"].get<std::vector<std::vector<int32_t>>>(), r.tokens);
    std::ifstream win(warm_path);
    EXPECT_EQ(nlohmann::json::parse(win)["generated"].get<std::vector<std::vector<int32_t>>>(), r.tokens);
    ++n;
  }
  EXPECT_EQ(n, 2);
}

}  // namespace
}  // namespace moe
