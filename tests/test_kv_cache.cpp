// The KV cache's dtype (model/kv_cache.h, --kv-cache-dtype): a bf16 cache stores each
// value rounded to the nearest bf16 (ties to even) and reads it back exactly, takes half
// the bytes (dense and paged), gives whole-model logits within a bf16 bound of the f32
// cache on every fixture (GQA and MLA) and the transformers greedy tokens where the
// fixture's greedy margin exceeds that bound, and keeps KV-cached decode bitwise equal to
// recomputing the prefix. (The GQA kernel's bits against the plain loop over a bf16
// cache: test_attention_kernels.cpp; serve's paged engine with a bf16 cache:
// test_serve_engine.cpp ServeEngineKvBf16.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "model/kv_cache.h"
#include "runtime/generate.h"
#include "test_model_util.h"

namespace moe {
namespace {

using test::ModelFixture;

std::unique_ptr<Model> load(const std::string& dir, DType kv, int64_t n_slots = 3, int64_t max_seq = 32) {
  ModelOptions o;
  o.n_slots = n_slots;
  o.max_seq = max_seq;
  o.kv_cache_dtype = kv;
  return Model::load(dir, o);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(KvCacheDtype, Bf16StoresRoundToNearestEvenAndReadsBackExactly) {
  KvCacheShape ks;
  ks.n_layers = 2;
  ks.n_slots = 2;
  ks.max_seq = 20;
  ks.a_dim = 6;
  ks.b_dim = 3;
  ks.dtype = DType::BF16;
  KvCache c(ks);
  // bf16 keeps 7 fraction bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (ties to the
  // even fraction: 1), 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6);
  // 1 + 2^-7, -3 and 0.5 are bf16 values already; 1 + 2^-8 + 2^-20 is past the tie (up).
  const float x = std::ldexp(1.f, -8), y = std::ldexp(1.f, -20);
  const float a[6] = {1 + x, 1 + 3 * x, 1 + 2 * x, -3.f, 0.5f, 1 + x + y};
  const float want[6] = {1.f, 1 + 4 * x, 1 + 2 * x, -3.f, 0.5f, 1 + 2 * x};
  const float b[3] = {-(1 + x), 65536.f, -0.f};
  c.put_a(1, 1, 17, a);
  c.put_b(1, 1, 17, b);
  float buf[6] = {};
  const float* ra = c.row_a(1, 1, 17, buf);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ra[i], want[i]) << i;
  float bbuf[3] = {};
  const float* rb = c.row_b(1, 1, 17, bbuf);
  EXPECT_EQ(rb[0], -1.f);
  EXPECT_EQ(rb[1], 65536.f);
  EXPECT_TRUE(std::signbit(rb[2]) && rb[2] == 0.f);
  // Nothing else was written: another position and layer still read zeros.
  const float* other = c.row_a(0, 1, 17, buf);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(other[i], 0.f);
  // The raw row holds the bf16 bits (the top half of the f32).
  const uint16_t* raw = c.a_row<uint16_t>(1, 1, 17);
  uint32_t u;
  std::memcpy(&u, &want[1], 4);
  EXPECT_EQ(raw[1], static_cast<uint16_t>(u >> 16));
}

TEST(KvCacheDtype, F32StoresExactly) {
  KvCacheShape ks;
  ks.n_layers = 1;
  ks.max_seq = 4;
  ks.a_dim = ks.b_dim = 2;
  KvCache c(ks);
  const std::vector<float> a = {1 + std::ldexp(1.f, -20), -7.25f};  // not a bf16 value, and one that is
  c.put_a(0, 0, 3, a.data());
  std::vector<float> buf(2);
  const float* r = c.row_a(0, 0, 3, buf.data());
  EXPECT_EQ(r[0], a[0]);
  EXPECT_EQ(r[1], a[1]);
}

TEST(KvCacheDtype, Bf16HalvesTheBytesDenseAndPaged) {
  KvCacheShape ks;
  ks.n_layers = 3;
  ks.n_slots = 2;
  ks.max_seq = 40;
  ks.a_dim = 8;
  ks.b_dim = 8;
  ks.block_size = 16;
  // 3 layers x 2 slots x 3 blocks x 16 positions x (8 + 8) values x 4 bytes.
  EXPECT_EQ(ks.bytes(), uint64_t{3 * 2 * 3 * 16 * 16 * 4});
  KvCacheShape kb = ks;
  kb.dtype = DType::BF16;
  EXPECT_EQ(kb.bytes() * 2, ks.bytes());
  EXPECT_EQ(KvCacheShape::bytes_per_block(3, 16, 8, 8, DType::BF16), uint64_t{3 * 16 * 16 * 2});

  // A whole model: half the bytes dense; the same paged budget holds twice the blocks.
  const std::string dir = test::fixtures_dir() + "/qwen3_moe";
  auto f = load(dir, DType::F32), b = load(dir, DType::BF16);
  EXPECT_EQ(b->cache().shape().bytes() * 2, f->cache().shape().bytes());
  EXPECT_EQ(b->cache().dtype(), DType::BF16);
  ModelOptions o;
  o.n_slots = 4;
  o.max_seq = 64;
  o.paged_kv = true;
  const KvCacheShape& fs = f->cache().shape();
  const uint64_t f32_block = KvCacheShape::bytes_per_block(fs.n_layers, fs.block_size, fs.a_dim, fs.b_dim, DType::F32);
  o.kv_cache_bytes = 5 * f32_block;
  auto pf = Model::load(dir, o);
  o.kv_cache_dtype = DType::BF16;
  auto pb = Model::load(dir, o);
  EXPECT_EQ(pf->cache().shape().n_blocks, 5);
  EXPECT_EQ(pb->cache().shape().n_blocks, 10);
  EXPECT_EQ(pb->cache().shape().bytes(), pf->cache().shape().bytes());
}

TEST(KvCacheDtype, BadDtypeIsAClearError) {
  EXPECT_NE(error_of([] { parse_kv_cache_dtype("fp8"); }).find("KV cache dtype 'fp8' is not supported: expected f32 or bf16"),
            std::string::npos);
  KvCacheShape ks;
  ks.n_layers = 1;
  ks.max_seq = 4;
  ks.a_dim = ks.b_dim = 2;
  ks.dtype = DType::F16;
  EXPECT_NE(error_of([&] { KvCache c(ks); }).find("KV cache dtype f16 is not supported"), std::string::npos);
}

// `moe-ep generate --kv-cache-dtype bf16` builds a bf16 cache (half the f32 cache's
// bytes in --output-json) and gives the tokens of generate() with a bf16 cache.
TEST(KvCacheDtype, GenerateFlagReachesTheModel) {
  const std::string dir = test::fixtures_dir() + "/deepseek_v2";  // MLA: the latent cache
  test::TempDir tmp;
  auto run = [&](const std::string& dtype) {
    std::string out;
    const std::string json = tmp / (dtype + ".json");
    EXPECT_EQ(test::run_command(std::string(MOE_EP_BINARY) + " generate --model " + dir +
                                    " --prompt-ids \"3,1,4,1,5;9,2,6\" --max-new-tokens 8 --ignore-eos --max-seq-len 24"
                                    " --kv-cache-dtype " + dtype + " --output-json " + json,
                                &out),
              0)
        << out;
    std::ifstream in(json);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json f = run("f32"), b = run("bf16");
  EXPECT_EQ(f["kv_cache"]["dtype"], "f32");
  EXPECT_EQ(b["kv_cache"]["dtype"], "bf16");
  EXPECT_EQ(b["kv_cache"]["bytes"].get<uint64_t>() * 2, f["kv_cache"]["bytes"].get<uint64_t>());
  auto m = load(dir, DType::BF16, 2, 24);
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.ignore_eos = true;
  const GenerateResult r = generate(*m, {{3, 1, 4, 1, 5}, {9, 2, 6}}, go);
  EXPECT_EQ(b["generated"].get<std::vector<std::vector<int32_t>>>(), r.tokens);
  EXPECT_EQ(m->cache().shape().bytes(), b["kv_cache"]["bytes"].get<uint64_t>());
}

class KvCacheBf16Model : public ::testing::TestWithParam<ModelFixture> {};

std::string fixture_name(const ::testing::TestParamInfo<ModelFixture>& i) { return i.param.name; }

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(t.data<float>()[i])));
  return m;
}

// Bound: 0.5% of the largest |f32-cache logit| at every position, except that one
// position per fixture may flip a near-tied routing decision (as in test_model.cpp's
// Bf16LogitsWithinBound; these inputs were not filtered for routing margins: mixtral
// prompt 2 position 3 flips here too, an error of ~1.0 there). Why 0.5%: rounding K and V
// (or MLA's latent c_kv and k_pe) to bf16 moves each by at most 2^-9 = 0.2% relative;
// that perturbs the attention outputs, which then pass through o_proj, the MLP and 2-3
// layers with residuals - the error path of the bf16-weight test, which rounds every
// GEMM input and weight and sees 0.3-0.6% of max |logit|. The bf16 cache rounds only K
// and V, so its error must stay under that: observed 0.15-0.38% per family (printed).
constexpr double kRelBound = 5e-3;

TEST_P(KvCacheBf16Model, LogitsWithinBf16BoundOfTheF32Cache) {
  const ModelFixture& f = GetParam();
  const Tensor ref = prefill_logits(*load(f.dir, DType::F32), f.prompts);
  const Tensor got = prefill_logits(*load(f.dir, DType::BF16), f.prompts);
  const double scale = max_abs(ref);
  const int64_t S = got.dim(1), V = got.dim(2);
  int outliers = 0;
  double worst = 0, worst_in = 0;
  for (size_t i = 0; i < f.prompts.size(); ++i)
    for (size_t p = 0; p < f.prompts[i].size(); ++p) {
      double d = 0;
      for (int64_t v = 0; v < V; ++v)
        d = std::max(d, static_cast<double>(std::fabs(got.data<float>()[(i * S + p) * V + v] -
                                                      ref.data<float>()[(i * S + p) * V + v])));
      worst = std::max(worst, d);
      if (d > kRelBound * scale) {
        ++outliers;
        std::printf("[ kv ] %-16s outlier: prompt %zu position %zu, max |diff| %.3g\n", f.name.c_str(), i, p, d);
      } else {
        worst_in = std::max(worst_in, d);
      }
    }
  std::printf("[ kv ] %-16s bf16 cache: max |logit - f32 cache| = %.3g (%.3f%% of max |logit| %.3g); %d outlier rows\n",
              f.name.c_str(), worst, 100 * worst_in / scale, scale, outliers);
  EXPECT_GT(worst, 0.0) << "the bf16 cache did not round anything";
  EXPECT_LE(outliers, 1);
}

// The fixture's top-1/top-2 logit gap of each greedy step (transformers), per prompt.
std::vector<std::vector<double>> step_margins(const ModelFixture& f) {
  for (const auto& e : test::manifest())
    if (e["name"] == f.name) {
      std::ifstream in(test::fixtures_dir() + "/" + e["greedy"].get<std::string>());
      const nlohmann::json g = nlohmann::json::parse(in);
      std::vector<std::vector<double>> out;
      for (const auto& p : g["prompts"]) out.push_back(p["top2_margin"].get<std::vector<double>>());
      return out;
    }
  ADD_FAILURE() << "no manifest entry for " << f.name;
  return {};
}

// Greedy decoding with the bf16 cache gives transformers' tokens at every step whose
// top-1/top-2 gap (the fixture's greedy margins) exceeds twice the bound, up to the
// first step that does not: with the same tokens before it, a step's argmax cannot flip
// while every logit moves by less than half the gap. Past a narrow step the prefix may
// differ, so the rest is only reported.
TEST_P(KvCacheBf16Model, GreedyTokensEqualTransformersWhereTheMarginAllows) {
  const ModelFixture& f = GetParam();
  auto m = load(f.dir, DType::BF16);
  GenerateOptions go;
  go.max_new_tokens = 16;
  go.ignore_eos = true;  // as the goldens
  const GenerateResult r = generate(*m, f.prompts, go);
  const double eps = kRelBound * max_abs(f.logits);
  const std::vector<std::vector<double>> margins = step_margins(f);
  ASSERT_EQ(r.tokens.size(), f.greedy.size());
  ASSERT_EQ(margins.size(), f.greedy.size());
  for (size_t i = 0; i < f.greedy.size(); ++i) {
    ASSERT_EQ(margins[i].size(), f.greedy[i].size());
    ASSERT_EQ(r.tokens[i].size(), f.greedy[i].size());
    size_t s = 0;
    for (; s < f.greedy[i].size() && margins[i][s] > 2 * eps; ++s)
      ASSERT_EQ(r.tokens[i][s], f.greedy[i][s]) << "prompt " << i << " step " << s << " (margin " << margins[i][s] << ")";
    std::printf("[ kv ] %-16s prompt %zu: %zu of 16 steps checked (margin > 2 x %.3g); all 16 tokens %s\n",
                f.name.c_str(), i, s, eps, r.tokens[i] == f.greedy[i] ? "equal" : "not all equal");
  }
}

// Each decode step's logits are bitwise those of a fresh prefill of prompt + tokens so
// far, with a bf16 cache on both sides: prefill also reads back the rounded K/V it just
// stored, so both read the same values.
TEST_P(KvCacheBf16Model, DecodeEqualsRecomputeBitwise) {
  const ModelFixture& f = GetParam();
  auto m = load(f.dir, DType::BF16);
  GenerateOptions go;
  go.max_new_tokens = 5;
  go.ignore_eos = true;
  go.keep_logits = true;
  const GenerateResult r = generate(*m, f.prompts, go);
  const int64_t V = m->config().vocab_size;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    ASSERT_EQ(r.step_logits[i].size(), static_cast<size_t>(go.max_new_tokens * V));
    for (int64_t step = 0; step < go.max_new_tokens; ++step) {
      std::vector<int32_t> seq = f.prompts[i];
      seq.insert(seq.end(), r.tokens[i].begin(), r.tokens[i].begin() + step);
      auto fresh = load(f.dir, DType::BF16, 1, 32);
      const Tensor full = prefill_logits(*fresh, {seq});  // [1, len, V]
      const float* last = full.data<float>() + (static_cast<int64_t>(seq.size()) - 1) * V;
      ASSERT_EQ(std::memcmp(r.step_logits[i].data() + step * V, last, V * sizeof(float)), 0)
          << f.name << " prompt " << i << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCacheBf16Model, ::testing::ValuesIn(test::model_fixtures()), fixture_name);

// Head-major V (GQA's layout): rows read back as they went in, dense and paged, and one
// KV head's values of a block are one contiguous run, positions b_pos_stride() apart.
TEST(KvCacheLayout, HeadMajorPlaneBReadsBackAndKeepsEachHeadsBlockContiguous) {
  for (bool paged : {false, true})
    for (DType dt : {DType::F32, DType::BF16}) {
      KvCacheShape ks;
      ks.n_layers = 2;
      ks.n_slots = 2;
      ks.max_seq = 40;
      ks.a_dim = ks.b_dim = 12;
      ks.block_size = 8;
      ks.b_heads = 3;
      ks.dtype = dt;
      if (paged) ks.n_blocks = 12;
      KvCache c(ks);
      if (paged) {
        c.set_blocks(0, {7, 2, 9, 0, 4});
        c.set_blocks(1, {1, 11, 3, 8, 5});
      }
      auto val = [](int64_t slot, int64_t pos, int64_t i) { return static_cast<float>(slot * 1000 + pos * 16 + i); };
      std::vector<float> row(12);
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t p = 0; p < 40; ++p) {
          for (int64_t i = 0; i < 12; ++i) row[i] = val(s, p, i);
          c.put_b(1, s, p, row.data());
        }
      std::vector<float> buf(12), want(12);
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t p = 0; p < 40; ++p) {
          for (int64_t i = 0; i < 12; ++i)
            want[i] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(val(s, p, i))) : val(s, p, i);
          const float* r = c.row_b(1, s, p, buf.data());
          for (int64_t i = 0; i < 12; ++i) ASSERT_EQ(r[i], want[i]) << s << " " << p << " " << i;
          for (int64_t h = 0; h < 3; ++h) {
            const char* base = nullptr;
            const char* at = nullptr;
            if (dt == DType::F32) {
              const float* hp = c.b_head<float>(1, s, p, h, 4);
              for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(hp[i], want[h * 4 + i]);
              at = reinterpret_cast<const char*>(hp);
              base = reinterpret_cast<const char*>(c.b_head<float>(1, s, p - p % 8, h, 4));
            } else {
              const uint16_t* hp = c.b_head<uint16_t>(1, s, p, h, 4);
              for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(bf16_to_f32(hp[i]), want[h * 4 + i]);
              at = reinterpret_cast<const char*>(hp);
              base = reinterpret_cast<const char*>(c.b_head<uint16_t>(1, s, p - p % 8, h, 4));
            }
            EXPECT_EQ(at - base, (p % 8) * c.b_pos_stride() * static_cast<int64_t>(dtype_size(dt)));
          }
        }
      EXPECT_EQ(c.b_pos_stride(), 4);
      // Layer 0 was never written.
      const float* z = c.row_b(0, 1, 39, buf.data());
      for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(z[i], 0.f);
    }
  KvCacheShape bad;
  bad.n_layers = 1;
  bad.max_seq = 4;
  bad.a_dim = bad.b_dim = 10;
  bad.b_heads = 3;
  EXPECT_NE(error_of([&] { KvCache c(bad); }).find("10 values in 3 heads"), std::string::npos);
}

}  // namespace
}  // namespace moe
