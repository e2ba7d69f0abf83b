// Decoder pieces and the CLI verbs: RoPE (default, interleaved, YaRN) against direct
// formulas, the sampler's determinism, and `moe-ep forward` / `generate`.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>

#include "loader/checkpoint.h"
#include "loader/safetensors.h"
#include "model/layers.h"
#include "model/registry.h"
#include "runtime/sampler.h"
#include "test_model_util.h"

namespace moe {
namespace {

TEST(Rope, DefaultRotateHalfAndInterleaved) {
  RopeConfig rc;
  rc.theta = 10000;
  rc.dim = 8;
  for (bool inter : {false, true}) {
    rc.interleaved = inter;
    Rope r(rc);
    const int32_t pos[1] = {7};
    RopeTables tab;
    r.tables(pos, 1, tab);
    std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = x;
    r.apply(y.data(), 1, 8, tab, 0);
    for (int i = 0; i < 4; ++i) {
      const double f = 7.0 / std::pow(10000.0, 2.0 * i / 8), c = std::cos(f), s = std::sin(f);
      const int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + 4;
      EXPECT_NEAR(y[a], x[a] * c - x[b] * s, 1e-5);
      EXPECT_NEAR(y[b], x[b] * c + x[a] * s, 1e-5);
    }
  }
}

// rms_norm's sum of squares runs in the order layers.cpp documents (16 running sums, added
// in halves, then the n % 16 tail in order), on every ISA: a scalar model of that order
// gives the same bits; and the result is within a few ulp of a double-precision norm.
TEST(RmsNorm, SumOfSquaresRunsInItsDocumentedOrder) {
  uint32_t st = 11;
  auto u = [&] {
    st = st * 1664525u + 1013904223u;
    return static_cast<float>(st >> 8) / 16777216.0f - 0.5f;
  };
  for (int64_t n : {1, 7, 15, 16, 17, 33, 128, 2048, 2050, 7168}) {
    std::vector<float> x(n), w(n), y(n);
    for (auto& v : x) v = 16 * u() * (1 + 1000 * (u() > 0.49f));  // a few large values: order matters
    for (auto& v : w) v = 2 * u();
    rms_norm(x.data(), w.data(), 1, n, 1e-6, y.data());
    float s[16] = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) s[l] = s[l] + x[i + l] * x[i + l];
    for (int h = 8; h > 0; h /= 2)
      for (int l = 0; l < h; ++l) s[l] = s[l] + s[l + h];
    float ss = s[0];
    for (; i < n; ++i) ss = ss + x[i] * x[i];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + 1e-6f);
    double dss = 0;
    for (float v : x) dss += static_cast<double>(v) * v;
    const double dr = 1.0 / std::sqrt(dss / static_cast<double>(n) + 1e-6);
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_EQ(y[k], w[k] * (x[k] * r)) << "n " << n << " element " << k;
      ASSERT_NEAR(y[k], w[k] * x[k] * dr, 1e-5 * std::abs(w[k] * x[k] * dr) + 1e-30) << "n " << n;
    }
  }
}

// A prompt's rows go over the threads (kRowParallelElems); each row keeps the bits it has
// alone: norms of 64 rows of 1024 against 64 one-row calls, RoPE tables of 300 positions
// against one position at a time.
TEST(RowParallel, NormsAndRopeTablesEqualRowByRow) {
  const int64_t T = 64, n = 1024;
  ASSERT_GE(T * n, kRowParallelElems);  // the threaded path
  std::vector<float> x(T * n), w(n), all(T * n), one(T * n);
  uint32_t st = 7;
  auto u = [&] {
    st = st * 1664525u + 1013904223u;
    return static_cast<float>(st >> 8) / 16777216.0f - 0.5f;
  };
  for (auto& v : x) v = 8 * u();
  for (auto& v : w) v = 2 * u();
  rms_norm(x.data(), w.data(), T, n, 1e-6, all.data());
  for (int64_t t = 0; t < T; ++t) rms_norm(x.data() + t * n, w.data(), 1, n, 1e-6, one.data() + t * n);
  EXPECT_EQ(std::memcmp(all.data(), one.data(), all.size() * sizeof(float)), 0);

  RopeConfig rc;
  rc.theta = 1e6;
  rc.dim = 128;
  Rope r(rc);
  std::vector<int32_t> pos(300);
  for (int i = 0; i < 300; ++i) pos[i] = 5 + 7 * i;
  ASSERT_GE(300 * 64 * 8, kRowParallelElems);
  RopeTables tab, single;
  r.tables(pos.data(), 300, tab);
  for (int i = 0; i < 300; ++i) {
    r.tables(&pos[i], 1, single);
    ASSERT_EQ(std::memcmp(tab.cos.data() + i * 64, single.cos.data(), 64 * sizeof(float)), 0) << i;
    ASSERT_EQ(std::memcmp(tab.sin.data() + i * 64, single.sin.data(), 64 * sizeof(float)), 0) << i;
  }
}

// YaRN per the paper / HF _compute_yarn_parameters, written out in double here.
TEST(Rope, YarnMatchesDirectFormula) {
  RopeConfig rc;
  rc.type = "yarn";
  rc.theta = 10000;
  rc.dim = 64;
  rc.factor = 40;
  rc.mscale = 1.0;
  rc.mscale_all_dim = 0.707;
  rc.original_max_position = 4096;
  double af = 0;
  const std::vector<float> inv = rope_inv_freq(rc, &af);
  const double pi = std::acos(-1.0);
  auto cdim = [&](double rot) { return 64 * std::log(4096 / (rot * 2 * pi)) / (2 * std::log(10000.0)); };
  const double low = std::max(0.0, std::floor(cdim(32))), high = std::min(63.0, std::ceil(cdim(1)));
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(10000.0, 2.0 * i / 64);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = (1.0 / (40 * base)) * ramp + (1.0 / base) * (1 - ramp);
    EXPECT_NEAR(inv[i], want, 1e-6 * want + 1e-12) << i;
  }
  auto m = [](double s, double ms) { return s <= 1 ? 1.0 : 0.1 * ms * std::log(s) + 1.0; };
  EXPECT_NEAR(af, m(40, 1.0) / m(40, 0.707), 1e-12);
  EXPECT_EQ(yarn_get_mscale(1.0, 5.0), 1.0);

  // DeepSeek with YaRN: softmax scale = qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2.
  nlohmann::json cfg = Checkpoint::open(test::fixtures_dir() + "/deepseek_v3").config();
  cfg.erase("rope_parameters");
  cfg["rope_theta"] = 10000.0;
  cfg["rope_scaling"] = {{"type", "yarn"}, {"factor", 40.0}, {"mscale", 0.707}, {"mscale_all_dim", 0.707},
                         {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1}};
  const ModelConfig c = model_config_from_hf(cfg);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_EQ(c.rope.dim, 4);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_NEAR(c.attn_scale, std::pow(m(40, 0.707), 2) / std::sqrt(12.0), 1e-12);
}

TEST(Sampler, GreedyAndSeededDraws) {
  std::vector<float> lg = {0.1f, 2.0f, 2.0f, -1.0f, 1.5f};
  SamplingParams g;
  EXPECT_EQ(sample_token(lg.data(), 5, g, 0, 0), 1);  // ties to the lower id
  SamplingParams s;
  s.temperature = 1.0;
  s.seed = 42;
  // Same (seed, request, step) -> same token; top-k 1 and tiny top-p are greedy.
  for (uint64_t step = 0; step < 20; ++step)
    EXPECT_EQ(sample_token(lg.data(), 5, s, 3, step), sample_token(lg.data(), 5, s, 3, step));
  SamplingParams k1 = s;
  k1.top_k = 1;
  SamplingParams p0 = s;
  p0.top_p = 1e-6;
  for (uint64_t step = 0; step < 20; ++step) {
    EXPECT_EQ(sample_token(lg.data(), 5, k1, 0, step), 1);
    EXPECT_EQ(sample_token(lg.data(), 5, p0, 0, step), 1);
  }
  // top-k 3 never picks outside {1, 2, 4}; the empirical distribution follows softmax.
  SamplingParams k3 = s;
  k3.top_k = 3;
  std::vector<int> count(5);
  for (uint64_t step = 0; step < 4000; ++step) ++count[sample_token(lg.data(), 5, k3, 1, step)];
  EXPECT_EQ(count[0] + count[3], 0);
  const double z = std::exp(2.0) * 2 + std::exp(1.5);
  EXPECT_NEAR(count[4] / 4000.0, std::exp(1.5) / z, 0.03);
  // Uniforms are in [0, 1) and differ between requests.
  EXPECT_NE(counter_uniform(1, 0, 0), counter_uniform(1, 1, 0));
  EXPECT_NE(counter_uniform(1, 0, 0), counter_uniform(2, 0, 0));
}

// The vectorised greedy pick is the one-pass logit_before scan on any row: ties (to the
// lower id), -0 against +0, NaN (never above a number), infinities, rows of every length
// around the 16 lanes, the best in the tail or in the lanes.
TEST(Sampler, GreedyTokenIsTheFirstBestInLogitBeforeOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> pool = {0.5f, -0.f, 0.f, 1.f, 1.f, -1.f, nan, inf, -inf, 3.f, 3.f, 2.5f};
  const std::vector<float> no_number = {nan, -inf};
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  int checked = 0;
  // From 2^14 logits the scan is split over the team: its parts' borders must not matter.
  for (const auto& [V, threads] : std::vector<std::pair<int64_t, int>>{
           {1, 1}, {2, 1}, {15, 1}, {16, 1}, {17, 1}, {31, 1}, {33, 1}, {100, 1}, {32000, 1}, {32000, 2},
           {32000, 3}, {40001, 7}, {16384, 16}}) {
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<float> lg(V);
      // Few distinct values, so ties are common; every 4th row holds only NaN and -inf.
      const std::vector<float>& src = trial % 4 == 0 ? no_number : pool;
      for (auto& x : lg) x = src[next() % src.size()];
      if (trial % 5 == 1) lg[next() % V] = 7.f;  // one clear best anywhere (the tail too)
      int32_t want = 0;
      for (int32_t i = 1; i < V; ++i)
        if (logit_before(lg.data(), i, want)) want = i;
      int32_t got;
      {
        test::TeamScope team(threads);
        got = greedy_token(lg.data(), V);
      }
      ASSERT_EQ(got, want) << "V " << V << " threads " << threads << " trial " << trial;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 13 * 60);
  const std::vector<float> zeros = {-0.f, 0.f, -0.f};
  EXPECT_EQ(greedy_token(zeros.data(), 3), 0);  // -0 == +0: the lower id
  const std::vector<float> nans = {nan, nan, -inf, nan};
  EXPECT_EQ(greedy_token(nans.data(), 4), 0);  // all keys -inf: id 0, as the scan gives
}

// ---- CLI ------------------------------------------------------------------------------

std::string ids_arg(const std::vector<std::vector<int32_t>>& prompts) {
  std::string s;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i) s += ";";
    for (size_t j = 0; j < prompts[i].size(); ++j) s += (j ? "," : "") + std::to_string(prompts[i][j]);
  }
  return s;
}

TEST(ModelCli, ForwardWritesGoldenLogits) {
  for (const auto& f : test::model_fixtures()) {
    if (f.name != "ernie4_5_moe" && f.name != "deepseek_v2" && f.name != "deepseek_v3_fp8") continue;
    test::TempDir tmp;
    std::string out;
    const int rc = test::run_command(std::string(MOE_EP_BINARY) + " forward --model " + f.dir + " --prompt-ids \"" +
                                         ids_arg(f.prompts) + "\" --logits " + (tmp / "l.safetensors"),
                                     &out);
    ASSERT_EQ(rc, 0) << out;
    auto file = SafetensorsFile::open(tmp / "l.safetensors");
    const Tensor lg = file->view("logits").clone(), len = file->view("lengths").clone();
    ASSERT_EQ(lg.shape(), f.logits.shape());
    ASSERT_EQ(len.dtype(), DType::I64);
    for (size_t i = 0; i < f.prompts.size(); ++i) EXPECT_EQ(len.data<int64_t>()[i], (int64_t)f.prompts[i].size());
    EXPECT_LE(test::max_logit_diff(lg, f.logits, f.prompts), 1e-4) << f.name;
  }
}

// generate, chat and serve default to the checkpoint's own dtype (config.json's
// torch_dtype; bf16 for quantised checkpoints) and a bf16 KV cache; forward to f32.
TEST(ModelCli, DtypeAutoIsTheCheckpointsOwn) {
  int seen = 0;
  for (const auto& f : test::model_fixtures()) {
    const bool bf16 = f.name == "qwen3_moe", f32 = f.name == "mixtral", fp8 = f.name == "deepseek_v3_fp8";
    if (!bf16 && !f32 && !fp8) continue;
    ++seen;
    test::TempDir tmp;
    std::string out;
    ASSERT_EQ(test::run_command(std::string(MOE_EP_BINARY) + " generate --quiet --model " + f.dir +
                                    " --prompt-ids 3,4 --max-new-tokens 2 --output-json " + (tmp / "g.json"),
                                &out),
              0)
        << out;
    std::ifstream in(tmp / "g.json");
    const auto j = nlohmann::json::parse(in);
    // qwen3_moe says bfloat16, mixtral float32, deepseek_v3_fp8 float32 but FP8-quantised.
    EXPECT_EQ(j["dtype"], f32 ? "f32" : "bf16") << f.name;
    EXPECT_EQ(j["kv_cache"]["dtype"], "bf16") << f.name;
  }
  EXPECT_EQ(seen, 3);
}

TEST(ModelCli, GenerateMatchesGreedyAndWritesJson) {
  for (const auto& f : test::model_fixtures()) {
    if (f.name != "mixtral" && f.name != "qwen3_moe_fp8") continue;
    test::TempDir tmp;
    std::string out;
    const int rc = test::run_command(std::string(MOE_EP_BINARY) + " generate --model " + f.dir + " --prompt-ids \"" +
                                         ids_arg(f.prompts) + "\" --max-new-tokens 16 --ignore-eos --dtype f32 "
                                         "--kv-cache-dtype f32 --output-json " + (tmp / "g.json"),
                                     &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("prefill"), std::string::npos) << out;
    EXPECT_NE(out.find("tokens/s"), std::string::npos) << out;
    EXPECT_NE(out.find("expert load"), std::string::npos) << out;
    std::ifstream in(tmp / "g.json");
    const auto j = nlohmann::json::parse(in);
    for (size_t i = 0; i < f.greedy.size(); ++i) EXPECT_EQ(j["generated"][i].get<std::vector<int32_t>>(), f.greedy[i]);
    EXPECT_GT(j["timings"]["decode_tokens_per_s"].get<double>(), 0);
    // The same prompts from a file (--prompt-ids @FILE, a trailing newline as editors write).
    {
      std::ofstream(tmp / "ids.txt") << ids_arg(f.prompts) << "\n";
      ASSERT_EQ(test::run_command(std::string(MOE_EP_BINARY) + " generate --model " + f.dir + " --prompt-ids @" +
                                      (tmp / "ids.txt") + " --max-new-tokens 16 --ignore-eos --dtype f32 "
                                      "--kv-cache-dtype f32 --quiet --output-json " + (tmp / "g2.json"),
                                  &out),
                0)
          << out;
      std::ifstream in2(tmp / "g2.json");
      const auto j2 = nlohmann::json::parse(in2);
      for (size_t i = 0; i < f.greedy.size(); ++i)
        EXPECT_EQ(j2["generated"][i].get<std::vector<int32_t>>(), f.greedy[i]) << "@FILE";
    }
    // Sampling: the same seed gives the same tokens.
    std::string a, b;
    const std::string cmd = std::string(MOE_EP_BINARY) + " generate --model " + f.dir +
                            " --prompt-ids \"3,4;5\" --max-new-tokens 8 --temperature 0.8 --top-k 20 --top-p 0.9 "
                            "--seed 7";
    ASSERT_EQ(test::run_command(cmd, &a), 0) << a;
    ASSERT_EQ(test::run_command(cmd, &b), 0) << b;
    EXPECT_EQ(a.substr(0, a.find("moe-ep generate")), b.substr(0, b.find("moe-ep generate")));
  }
}

// --threads wins, else OMP_NUM_THREADS, else the cores. --profile: every stage's time,
// the stages fit in the span's total, each stage is entered as often as the model
// runs it (qwen3_moe has no shared experts, deepseek_v3 has; MLA attention), and
// profiling changes no generated id.
TEST(ModelCli, ThreadsAndProfile) {
  const std::string bin = MOE_EP_BINARY;
  test::TempDir tmp;
  std::string out;
  for (const char* name : {"qwen3_moe", "deepseek_v3"}) {
    const std::string base = bin + " generate --model " + test::fixtures_dir() + "/" + name +
                             " --prompt-ids \"1,2,3,4,5\" --max-new-tokens 4 --ignore-eos ";
    ASSERT_EQ(test::run_command("OMP_NUM_THREADS=1 " + base + "--profile --output-json " + (tmp / "p.json"), &out), 0)
        << out;
    EXPECT_NE(out.find("; threads 1\n"), std::string::npos) << out;
    EXPECT_NE(out.find("moe-ep generate: profile of the prefill (5 tokens), ms: total "), std::string::npos) << out;
    EXPECT_NE(out.find("moe-ep generate: profile of the decode (3 tokens, 3 steps), ms per step: total "),
              std::string::npos)
        << out;
    ASSERT_EQ(test::run_command("OMP_NUM_THREADS=1 " + base + "--threads 2 --output-json " + (tmp / "q.json"), &out), 0)
        << out;
    EXPECT_NE(out.find("; threads 2\n"), std::string::npos) << out;
    EXPECT_EQ(out.find("profile of"), std::string::npos) << out;
    const auto p = nlohmann::json::parse(std::ifstream(tmp / "p.json"));
    const auto q = nlohmann::json::parse(std::ifstream(tmp / "q.json"));
    EXPECT_EQ(p["generated"], q["generated"]) << name;
    EXPECT_FALSE(q.contains("profile_s"));
    for (const char* span : {"prefill", "decode"}) {
      const auto& j = p["profile_s"][span];
      ASSERT_EQ(j.size(), 15u) << j.dump();  // 13 stages, other, total
      double sum = 0;
      for (const auto& [k, v] : j.items()) {
        EXPECT_GE(v.get<double>(), 0) << k;
        if (k != "total" && k != "other") sum += v.get<double>();
      }
      const double total = j["total"].get<double>();
      EXPECT_NEAR(total, span == std::string("prefill") ? p["timings"]["prefill_s"].get<double>()
                                                        : p["timings"]["decode_s"].get<double>(),
                  1e-12);
      EXPECT_LE(sum, total) << j.dump();  // leaves: on one thread they fit in the span
      EXPECT_GT(total, 0);
      // Entries per stage, exactly: both fixtures have 3 layers, 2 of them MoE (qwen3_moe's
      // mlp_only_layers [1], deepseek_v3's first_k_dense_replace 1); a dense MLP's GEMMs
      // count as gemm1/gemm2, the shared experts' GEMMs as "shared" (deepseek_v3's only).
      const int64_t steps = span == std::string("prefill") ? 1 : 3, layers = 3, moe = 2;
      const bool shared = std::string(name) == "deepseek_v3";
      const std::map<std::string, int64_t> want = {
          {"embed", steps},             {"attn_qkv", steps * layers}, {"attn_core", steps * layers},
          {"attn_out", steps * layers}, {"route", steps * moe},       {"expand", steps * moe},
          {"gemm1", steps * layers},    {"act_quant", 0},             {"gemm2", steps * layers},
          {"combine", steps * moe},     {"shared", shared ? steps * moe : 0},
          {"lm_head", steps},           {"sample", steps}};
      const auto& calls = p["profile_calls"][span];
      ASSERT_EQ(calls.size(), want.size()) << calls.dump();
      for (const auto& [st, n] : want) EXPECT_EQ(calls[st].get<int64_t>(), n) << name << " " << span << " " << st;
    }
  }
}

TEST(ModelCli, BadInputIsAClearError) {
  const std::string bin = MOE_EP_BINARY, dir = test::fixtures_dir() + "/qwen3_moe";
  std::string out;
  EXPECT_NE(test::run_command(bin + " forward --model " + dir + " --prompt-ids \"1,2,500\" --logits /tmp/x", &out), 0);
  EXPECT_NE(out.find("id 500 is out of vocabulary (vocab_size 112"), std::string::npos) << out;
  EXPECT_NE(test::run_command(bin + " forward --model " + dir + " --prompt-ids \"1,2;\" --logits /tmp/x", &out), 0);
  EXPECT_NE(out.find("prompt 1 is empty"), std::string::npos) << out;
  EXPECT_NE(test::run_command(bin + " forward --model " + dir + " --prompt-ids @/nonexistent/ids.txt --logits /tmp/x",
                              &out),
            0);
  EXPECT_NE(out.find("--prompt-ids: cannot read '/nonexistent/ids.txt'"), std::string::npos) << out;
  EXPECT_NE(test::run_command(bin + " generate --model " + dir + " --prompt-ids \"1,2,3\" --max-new-tokens 8 "
                                  "--max-seq-len 6",
                              &out),
            0);
  EXPECT_NE(out.find("over --max-seq-len 6"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(bin + " generate --help", &out), 0);
  for (const char* flag : {"--top-p", "--seed", "--max-seq-len", "--ep", "--tp", "--dp", "--moe-comm", "--dtype"})
    EXPECT_NE(out.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace moe
