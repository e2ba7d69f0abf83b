// The serving scheduler (serve/engine/model_engine.h) on one rank, against
// transformers' greedy tokens of every fixture model: a request gives the same tokens
// alone, beside many others, with its prompt prefilled in chunks, and with its KV blocks
// scattered over the pool; cancelled and finished requests give their blocks back;
// stop strings cut the text; bad requests are refused with the right status.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <thread>

#include "runtime/generate.h"
#include "test_serve_util.h"

namespace moe {
namespace {

using test::ModelFixture;
using test::Served;
using test::Result;
using test::drain;
using test::greedy;
using test::prefix;
using namespace std::chrono_literals;

class ServeEngine : public ::testing::TestWithParam<ModelFixture> {};

std::string fixture_name(const ::testing::TestParamInfo<ModelFixture>& i) { return i.param.name; }

TEST_P(ServeEngine, AloneEqualsTransformersGreedy) {
  const ModelFixture& f = GetParam();
  serve::EngineOptions eo;
  eo.max_num_seqs = 4;
  eo.max_batch_tokens = 4;  // prompts of 5 and 9 tokens prefill in 2 and 3 chunks
  Served s(f.dir, eo, 0);
  s.start();
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    Result r = drain(*s.engine->submit(greedy(f.prompts[i], 16)));
    EXPECT_EQ(r.finish, serve::Finish::length);
    EXPECT_EQ(r.ids, f.greedy[i]) << "prompt " << i;
  }
}

TEST_P(ServeEngine, ManyConcurrentRequestsEachEqualTheirGolden) {
  const ModelFixture& f = GetParam();
  serve::EngineOptions eo;
  eo.max_num_seqs = 6;
  eo.max_batch_tokens = 7;
  // 40 blocks of 4 positions: fewer than 24 requests need at once, so some wait for
  // blocks; blocks come back out of order, so later requests get scattered ones.
  Served s(f.dir, eo, 40);
  s.start();
  std::vector<std::shared_ptr<serve::Stream>> streams;
  std::vector<std::pair<size_t, int64_t>> what;
  for (int i = 0; i < 24; ++i) {
    const size_t p = i % f.prompts.size();
    const int64_t n = 1 + (i * 7) % 16;
    streams.push_back(s.engine->submit(greedy(f.prompts[p], n)));
    what.emplace_back(p, n);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r = drain(*streams[i]);
    EXPECT_EQ(r.finish, serve::Finish::length) << "request " << i;
    EXPECT_EQ(r.ids, prefix(f.greedy[what[i].first], what[i].second)) << "request " << i;
    EXPECT_EQ(streams[i]->prompt_tokens(), static_cast<int64_t>(f.prompts[what[i].first].size()));
    EXPECT_EQ(streams[i]->completion_tokens(), what[i].second);
  }
  std::this_thread::sleep_for(100ms);  // the loop retires the last ones before its next wait
  const std::string m = s.engine->metrics();
  EXPECT_NE(m.find("moe_ep_kv_cache_blocks_used 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("moe_ep_requests_running 0\n"), std::string::npos) << m;
}

// With a bf16 KV cache (--kv-cache-dtype bf16): blocks scattered over a pool too small
// for all requests at once, prompts prefilled in chunks beside other requests' decode
// steps, and every request still gives the tokens of a plain (dense-cache, one-batch)
// generate() with the bf16 cache: the paged engine reads the same rounded K/V.
class ServeEngineKvBf16 : public ::testing::TestWithParam<ModelFixture> {};

TEST_P(ServeEngineKvBf16, PagedRequestsEqualGenerateWithTheBf16Cache) {
  const ModelFixture& f = GetParam();
  ModelOptions mo;
  mo.n_slots = 3;
  mo.max_seq = 32;
  mo.kv_cache_dtype = DType::BF16;
  GenerateOptions go;
  go.max_new_tokens = 16;
  go.ignore_eos = true;
  const GenerateResult want = generate(*Model::load(f.dir, mo), f.prompts, go);
  serve::EngineOptions eo;
  eo.max_num_seqs = 6;
  eo.max_batch_tokens = 7;
  Served s(f.dir, eo, 40, 4, DType::BF16);
  ASSERT_EQ(s.model->cache().dtype(), DType::BF16);
  s.start();
  std::vector<std::shared_ptr<serve::Stream>> streams;
  std::vector<std::pair<size_t, int64_t>> what;
  for (int i = 0; i < 18; ++i) {
    const size_t p = i % f.prompts.size();
    const int64_t n = 1 + (i * 7) % 16;
    streams.push_back(s.engine->submit(greedy(f.prompts[p], n)));
    what.emplace_back(p, n);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r = drain(*streams[i]);
    EXPECT_EQ(r.finish, serve::Finish::length) << "request " << i;
    EXPECT_EQ(r.ids, prefix(want.tokens[what[i].first], what[i].second)) << "request " << i;
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_NE(s.engine->metrics().find("moe_ep_kv_cache_blocks_used 0\n"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServeEngine, ::testing::ValuesIn(test::model_fixtures()), fixture_name);
INSTANTIATE_TEST_SUITE_P(Fixtures, ServeEngineKvBf16, ::testing::ValuesIn(test::model_fixtures()), fixture_name);

using test::qwen3;

TEST(ServeEngineOne, CancelFreesBlocksAndOthersContinue) {
  const ModelFixture f = qwen3();
  serve::EngineOptions eo;
  eo.max_num_seqs = 4;
  // `a` asks for 2000 tokens, so it is still running when the cancel arrives: at 30
  // tokens it could finish first on a loaded machine (the test thread reads one token,
  // then cancels), and the test would then check nothing about cancelling.
  Served s(f.dir, eo, 0, 4, DType::F32, 2048);
  s.start();
  auto a = s.engine->submit(greedy(f.prompts[2], 2000));
  auto b = s.engine->submit(greedy(f.prompts[1], 16));
  serve::Delta d;
  while (d.tokens.empty()) a->read(&d, 50ms);
  a->cancel();
  Result rb = drain(*b);
  EXPECT_EQ(rb.ids, f.greedy[1]);
  Result ra = drain(*a);
  EXPECT_EQ(ra.finish, serve::Finish::cancelled);
  EXPECT_LT(ra.ids.size(), 2000u);
  // The engine returns the blocks when it next looks at its requests: wait for that
  // (bounded) instead of betting on a fixed sleep.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (s.engine->metrics().find("moe_ep_kv_cache_blocks_used 0\n") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_NE(s.engine->metrics().find("moe_ep_kv_cache_blocks_used 0\n"), std::string::npos);
}

TEST(ServeEngineOne, StopStringCutsTheTextBeforeIt) {
  const ModelFixture f = qwen3();
  Served s(f.dir, {}, 0);
  s.start();
  const std::vector<int32_t>& g = f.greedy[2];
  serve::RequestParams p = greedy(f.prompts[2], 16);
  // The first occurrence of the 4th golden token's text ends the request.
  const std::string stop = fmt::format("[{}]", g[3]);
  p.stop = {stop};
  Result r = drain(*s.engine->submit(p));
  std::string want;
  for (int32_t t : g) {
    const std::string piece = fmt::format("[{}]", t);
    if (piece == stop) break;
    want += piece;
  }
  EXPECT_EQ(r.finish, serve::Finish::stop);
  EXPECT_EQ(r.text, want);
}

TEST(ServeEngineOne, SeededSamplingIsTheSameAloneAndInABatch) {
  const ModelFixture f = qwen3();
  serve::EngineOptions eo;
  eo.max_num_seqs = 8;
  Served s(f.dir, eo, 0);
  s.start();
  serve::RequestParams p = greedy(f.prompts[2], 12);
  p.sampling.temperature = 0.9;
  p.sampling.top_p = 0.95;
  p.sampling.seed = 1234;
  const Result alone = drain(*s.engine->submit(p));
  std::vector<std::shared_ptr<serve::Stream>> crowd;
  for (int i = 0; i < 7; ++i) crowd.push_back(s.engine->submit(greedy(f.prompts[i % 3], 10)));
  const Result among = drain(*s.engine->submit(p));
  for (auto& c : crowd) drain(*c);
  EXPECT_EQ(alone.ids, among.ids);
  serve::RequestParams q = p;
  q.sampling.seed = 99;
  EXPECT_NE(drain(*s.engine->submit(q)).ids, alone.ids) << "a different seed should give different tokens";
}

// Checkpoints pad the vocabulary past the tokenizer (Qwen3: 151,936 rows, 151,669
// tokens). A padding id has no text: drawn, it used to end the engine ("decode: token id
// out of range", every later request 503). Draws now stay below the tokenizer's size,
// greedy, top-k (whose per-row limit is widened by the padding) and top-p alike.
TEST(ServeEngineOne, DrawsStayInTheTokenizersVocabulary) {
  const ModelFixture f = qwen3();
  auto model_for = [&] {
    ModelOptions o;
    o.n_slots = 4;
    o.max_seq = 48;
    o.paged_kv = true;
    o.kv_block_size = 4;
    return Model::load(f.dir, o);
  };
  auto model = model_for();
  const int64_t V = model->config().vocab_size, limit = V / 2;
  // The control: with the whole vocabulary, the greedy tokens reach past the limit.
  const std::vector<int32_t>& g = f.greedy[0];
  ASSERT_TRUE(std::any_of(g.begin(), g.end(), [&](int32_t t) { return t >= limit; }))
      << "the fixture's greedy tokens never pass V/2: this test would not test anything";
  test::IdTokenizer small(limit);
  serve::EngineOptions eo;
  eo.max_num_seqs = 4;
  serve::ModelEngine engine(*model, small, nullptr, eo);
  std::thread loop([&] { engine.run(); });
  std::vector<serve::RequestParams> ps(3, greedy(f.prompts[0], 16));
  ps[1].sampling.temperature = 1.0;
  ps[1].sampling.top_k = 3;
  ps[2].sampling.temperature = 1.0;
  ps[2].sampling.top_p = 0.9;
  for (auto& p : ps) {
    const Result r = drain(*engine.submit(p));
    EXPECT_EQ(r.finish, serve::Finish::length);
    EXPECT_EQ(r.ids.size(), 16u);
    for (int32_t t : r.ids) EXPECT_LT(t, limit);
  }
  engine.request_stop();
  loop.join();
}

TEST(ServeEngineOne, BadRequestsAreRefusedWithTheirStatus) {
  const ModelFixture f = qwen3();
  serve::EngineOptions eo;
  eo.max_queue = 2;
  Served s(f.dir, eo, 0);  // not started: requests stay queued
  auto status = [&](serve::RequestParams p) {
    try {
      s.engine->submit(std::move(p));
    } catch (const serve::ServeError& e) {
      return e.status;
    }
    return 200;
  };
  EXPECT_EQ(status(greedy({}, 4)), 400);                           // empty prompt
  EXPECT_EQ(status(greedy({1, 2, 100000}, 4)), 400);               // id outside the vocabulary
  EXPECT_EQ(status(greedy(std::vector<int32_t>(40, 1), 9)), 400);  // 40 + 9 > 48 positions
  EXPECT_EQ(status(greedy({1, 2}, 0)), 400);                       // max_tokens 0
  EXPECT_EQ(status(greedy({1, 2}, 4)), 200);
  EXPECT_EQ(status(greedy({1, 2}, 4)), 200);
  EXPECT_EQ(status(greedy({1, 2}, 4)), 503);  // --max-queue 2
}

}  // namespace
}  // namespace moe
