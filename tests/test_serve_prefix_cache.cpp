// Prefix caching and KV blocks taken as sequences grow (serve/engine/block_pool.h,
// model_engine.h): the pool's bookkeeping on its own, then the engine on every fixture
// model. The property that matters: a request served from cached blocks, or preempted
// and recomputed, returns the tokens and logprobs of a cold server (--no-prefix-cache)
// bit for bit; blocks are evicted least recently used; 64 clients on a pool for 8
// full-length requests all finish with their solo answers and leave nothing held.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "serve/engine/block_pool.h"
#include "test_serve_util.h"

namespace moe {
namespace {

using serve::BlockPool;
using test::drain;
using test::ModelFixture;
using test::Result;
using test::Served;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------------------
// BlockPool

// Chain keys of the full blocks of `t`.
std::vector<uint64_t> keys_of(const std::vector<int32_t>& t, int64_t bs, const std::string& salt = "") {
  std::vector<uint64_t> k;
  for (size_t j = 0; (j + 1) * bs <= t.size(); ++j)
    k.push_back(BlockPool::chain_key(k.empty() ? BlockPool::root_key(salt) : k.back(), t.data() + j * bs, bs));
  return k;
}

// Takes and publishes every full block of t (as a request that computed it would).
std::vector<int32_t> compute(BlockPool& pool, const std::vector<int32_t>& t, int64_t bs, const std::string& salt = "") {
  const std::vector<uint64_t> k = keys_of(t, bs, salt);
  std::vector<int32_t> blocks;
  uint64_t serial = 0;
  for (size_t j = 0; j < k.size(); ++j) {
    blocks.push_back(pool.take());
    serial = pool.publish(blocks.back(), k[j], t.data() + j * bs, serial, salt);
  }
  return blocks;
}

std::vector<int32_t> match(BlockPool& pool, const std::vector<int32_t>& t, int64_t bs, const std::string& salt = "") {
  uint64_t serial = 0;
  return pool.match(keys_of(t, bs, salt), t, salt, 1 << 20, &serial);
}

TEST(BlockPool, SharesOnlyWholeEqualPrefixes) {
  BlockPool pool(8, 2, true);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> blocks = compute(pool, a, 2);
  EXPECT_EQ(match(pool, a, 2), blocks);                                      // the whole prefix
  EXPECT_EQ(match(pool, {1, 2, 3, 4, 9, 9}, 2), test::prefix(blocks, 2));       // up to where they differ
  EXPECT_TRUE(match(pool, {9, 9, 3, 4, 5, 6}, 2).empty()) << "equal later blocks after a different first one";
  EXPECT_TRUE(match(pool, a, 2, "tenant").empty()) << "another cache_salt";
  // A key that names a's second block, with other tokens: the token check refuses it.
  const std::vector<int32_t> forged = {1, 2, 7, 7};
  uint64_t serial = 0;
  std::vector<uint64_t> k = keys_of(a, 2);
  k.resize(2);
  EXPECT_EQ(pool.match(k, forged, "", 2, &serial), test::prefix(blocks, 1));
}

TEST(BlockPool, EvictsTheLeastRecentlyReleasedAndNeverAHeldBlock) {
  BlockPool pool(3, 2, true);
  const std::vector<std::vector<int32_t>> seqs = {{1, 1}, {2, 2}, {3, 3}};
  std::vector<int32_t> ids;
  for (const auto& s : seqs) ids.push_back(compute(pool, s, 2)[0]);
  EXPECT_EQ(pool.available(), 0);
  pool.release(ids[1]);  // release order 1, 0: block 1 is the least recently released
  pool.release(ids[0]);
  EXPECT_EQ(pool.n_cached(), 2);
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_EQ(pool.take(), ids[1]);
  EXPECT_TRUE(match(pool, seqs[1], 2).empty()) << "an evicted block is forgotten";
  EXPECT_EQ(match(pool, seqs[0], 2), std::vector<int32_t>{ids[0]}) << "a cached block comes back";
  EXPECT_EQ(pool.available(), 0) << "held blocks (matched or taken) are not available";
}

TEST(BlockPool, ABlockComputedTwiceIsSharedOnceAndTheCopyFreed) {
  BlockPool pool(8, 2, true);
  const std::vector<int32_t> t = {4, 5, 6, 7};
  const std::vector<uint64_t> k = keys_of(t, 2);
  // Two requests computed block 0 at once; the second one's copy stays private but its
  // next block chains to the first one's, so the whole prefix matches.
  const int32_t a0 = pool.take(), b0 = pool.take(), b1 = pool.take();
  const uint64_t sa = pool.publish(a0, k[0], t.data(), 0, "");
  const uint64_t sb = pool.publish(b0, k[0], t.data(), 0, "");
  EXPECT_EQ(sa, sb);
  pool.publish(b1, k[1], t.data() + 2, sb, "");
  EXPECT_EQ(match(pool, t, 2), (std::vector<int32_t>{a0, b1}));
  pool.release(b0);
  EXPECT_EQ(pool.n_free(), 8 - 2) << "the private copy is free at release, not cached";
  EXPECT_EQ(pool.n_cached(), 0);
}

TEST(BlockPool, OffPublishesNothing) {
  BlockPool pool(4, 2, false);
  const std::vector<int32_t> blocks = compute(pool, {1, 2, 3, 4}, 2);
  for (int32_t b : blocks) pool.release(b);
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_TRUE(match(pool, {1, 2, 3, 4}, 2).empty());
}

// ---------------------------------------------------------------------------------------
// The engine

// The tokens and logprobs of two runs, bit for bit.
void expect_same(const Result& want, const Result& got, const std::string& what) {
  EXPECT_EQ(got.finish, want.finish) << what;
  ASSERT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.tokens[i].logprob, &want.tokens[i].logprob, sizeof(float)), 0)
        << what << ": logprob of token " << i << ": " << got.tokens[i].logprob << " vs " << want.tokens[i].logprob;
    ASSERT_EQ(got.tokens[i].top.size(), want.tokens[i].top.size()) << what;
    for (size_t j = 0; j < want.tokens[i].top.size(); ++j) {
      EXPECT_EQ(got.tokens[i].top[j].first, want.tokens[i].top[j].first) << what << " token " << i;
      EXPECT_EQ(std::memcmp(&got.tokens[i].top[j].second, &want.tokens[i].top[j].second, sizeof(float)), 0)
          << what << " token " << i;
    }
  }
}

serve::RequestParams with_logprobs(const std::vector<int32_t>& prompt, int64_t max_tokens, int top = 3) {
  serve::RequestParams p = test::greedy(prompt, max_tokens);
  p.top_logprobs = top;
  return p;
}

double metric(const serve::Engine& e, const std::string& name) {
  std::string m = "\n";
  m += e.metrics();
  const size_t at = m.find("\n" + name + " ");
  if (at == std::string::npos) {
    ADD_FAILURE() << name << " not in the metrics:\n" << m;
    return -1;
  }
  return std::stod(m.substr(at + name.size() + 2));
}

// The engine hands blocks back when it next looks at its requests: wait for that.
void expect_nothing_held(const serve::Engine& e) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while ((metric(e, "moe_ep_kv_cache_blocks_used") != 0 || metric(e, "moe_ep_requests_running") != 0) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(metric(e, "moe_ep_kv_cache_blocks_used"), 0);
  EXPECT_EQ(metric(e, "moe_ep_requests_running"), 0);
  EXPECT_EQ(metric(e, "moe_ep_kv_cache_blocks_cached") + metric(e, "moe_ep_kv_cache_blocks_free"),
            metric(e, "moe_ep_kv_cache_blocks_total"));
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

serve::EngineOptions options(bool prefix_cache, int64_t max_num_seqs = 4) {
  serve::EngineOptions eo;
  eo.max_num_seqs = max_num_seqs;
  eo.max_batch_tokens = 8;  // prompts prefill in chunks that do not end on block edges
  eo.prefix_cache = prefix_cache;
  return eo;
}

class ServePrefixCache : public ::testing::TestWithParam<ModelFixture> {};

TEST_P(ServePrefixCache, CachedEqualsColdBitForBit) {
  const ModelFixture& f = GetParam();
  const auto& p = f.prompts;  // lengths 1, 5, 9
  const std::vector<int32_t> shared = cat({p[2], p[1], p[2]});  // 23 tokens: 5 full blocks of 4
  const std::vector<int32_t> qa = cat({shared, {p[1][0], p[1][1]}});
  const int32_t other = p[1][0] == 7 ? 8 : 7;  // qb's block 5 differs from qa's in its last token
  const std::vector<int32_t> qb = cat({shared, {other, p[1][3], p[1][4]}});
  const int64_t n = 12;

  Served cold(f.dir, options(false), 0);
  cold.start();
  const Result ca = drain(*cold.engine->submit(with_logprobs(qa, n)));
  const Result cb = drain(*cold.engine->submit(with_logprobs(qb, n)));
  EXPECT_EQ(cb.cached, 0) << "--no-prefix-cache serves nothing from the cache";
  const Result cb2 = drain(*cold.engine->submit(with_logprobs(qb, n)));
  EXPECT_EQ(cb2.cached, 0);
  // qb followed by its first 6 generated tokens: the cache holds blocks of generated text too.
  const std::vector<int32_t> qc = cat({qb, test::prefix(cb.ids, 6)});
  const Result cc = drain(*cold.engine->submit(with_logprobs(qc, 8)));

  Served warm(f.dir, options(true), 0);
  warm.start();
  const Result wa = drain(*warm.engine->submit(with_logprobs(qa, n)));
  EXPECT_EQ(wa.cached, 0);
  expect_same(ca, wa, "first request");
  const Result wb = drain(*warm.engine->submit(with_logprobs(qb, n)));
  EXPECT_EQ(wb.cached, 20) << "the 5 full blocks qb shares with qa";
  expect_same(cb, wb, "shared prefix");
  const Result wb2 = drain(*warm.engine->submit(with_logprobs(qb, n)));
  EXPECT_EQ(wb2.cached, 24) << "all full blocks before qb's last token";
  expect_same(cb, wb2, "same prompt again");
  const Result wc = drain(*warm.engine->submit(with_logprobs(qc, 8)));
  EXPECT_EQ(wc.cached, 28) << "qb's generated tokens were cached as they were computed";
  expect_same(cc, wc, "prompt + generated");
  EXPECT_EQ(metric(*warm.engine, "moe_ep_prefix_cache_hits_total"), 20 + 24 + 28);
  EXPECT_EQ(metric(*warm.engine, "moe_ep_prefix_cache_queries_total"),
            static_cast<double>(qa.size() + 2 * qb.size() + qc.size()));
  expect_nothing_held(*warm.engine);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServePrefixCache, ::testing::ValuesIn(test::model_fixtures()),
                         [](const auto& i) { return i.param.name; });

// Prompts that differ in their first token: nothing shared between them.
std::vector<int32_t> variant(const ModelFixture& f, int k) { return cat({{static_cast<int32_t>(k + 1)}, f.prompts[2]}); }

TEST(ServePrefixCacheOne, EvictsLeastRecentlyUsedUnderASmallPool) {
  const ModelFixture f = test::qwen3();
  Served cold(f.dir, options(false, 1), 0);
  cold.start();
  std::vector<Result> want;
  for (int k = 0; k < 6; ++k) want.push_back(drain(*cold.engine->submit(with_logprobs(variant(f, k), 6))));

  // 12 blocks of 4: each request (10 + 6 positions) takes 4 and leaves its 3 full
  // computed blocks cached, so by the 4th request the oldest are evicted.
  Served warm(f.dir, options(true, 1), 12);
  warm.start();
  for (int k = 0; k < 6; ++k) expect_same(want[k], drain(*warm.engine->submit(with_logprobs(variant(f, k), 6))), "first run");
  const Result again0 = drain(*warm.engine->submit(with_logprobs(variant(f, 0), 6)));
  EXPECT_EQ(again0.cached, 0) << "the oldest request's blocks were evicted";
  expect_same(want[0], again0, "after eviction");
  const Result again5 = drain(*warm.engine->submit(with_logprobs(variant(f, 5), 6)));
  EXPECT_EQ(again5.cached, 8) << "the newest request's blocks are still cached";
  expect_same(want[5], again5, "from the cache");
  expect_nothing_held(*warm.engine);
}

TEST(ServePrefixCacheOne, SixtyFourClientsOnAPoolForEightFullLengthRequests) {
  const ModelFixture f = test::qwen3();
  const int64_t max_seq = 48, bs = 4, n = max_seq - 10;  // every request fills the whole context
  Served cold(f.dir, options(false, 1), 0, bs, DType::F32, max_seq);
  cold.start();
  std::vector<Result> solo;
  for (int k = 0; k < 8; ++k) solo.push_back(drain(*cold.engine->submit(with_logprobs(variant(f, k), n, 0))));

  serve::EngineOptions eo = options(true, 64);
  eo.max_batch_tokens = 128;
  Served s(f.dir, eo, 8 * max_seq / bs, bs, DType::F32, max_seq);
  s.start();
  std::vector<std::shared_ptr<serve::Stream>> streams;
  for (int i = 0; i < 64; ++i) streams.push_back(s.engine->submit(with_logprobs(variant(f, i % 8), n, 0)));
  for (int i = 0; i < 64; ++i) {
    const Result r = drain(*streams[i]);
    expect_same(solo[i % 8], r, "client " + std::to_string(i));
    EXPECT_EQ(r.finish, serve::Finish::length) << "client " << i;
  }
  EXPECT_GT(metric(*s.engine, "moe_ep_num_preemptions_total"), 0) << "the pool holds 8 of the 64: some must wait";
  expect_nothing_held(*s.engine);
}

TEST(ServePrefixCacheOne, OnlyAPromptLargerThanThePoolIsRefused) {
  const ModelFixture f = test::qwen3();
  Served s(f.dir, options(true, 2), 4);  // 4 blocks of 4: 16 positions in all
  s.start();
  try {
    s.engine->submit(test::greedy(cat({f.prompts[2], f.prompts[2]}), 1));  // 18 tokens
    ADD_FAILURE() << "a prompt larger than the pool was accepted";
  } catch (const serve::ServeError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("18 tokens"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("16 positions"), std::string::npos) << e.message;
  }
  // 9 + 30 positions fit the context (48) but not the pool: it runs until the pool is
  // full, alone, and ends with "length" (its tokens those of the golden).
  const Result r = drain(*s.engine->submit(test::greedy(f.prompts[2], 30)));
  EXPECT_EQ(r.finish, serve::Finish::length);
  EXPECT_EQ(r.ids, test::prefix(f.greedy[2], 16 - 9 + 1));
  expect_nothing_held(*s.engine);
}

TEST(ServePrefixCacheOne, CacheSaltSeparatesTenants) {
  const ModelFixture f = test::qwen3();
  Served s(f.dir, options(true), 0);
  s.start();
  auto run = [&](const std::string& salt) {
    serve::RequestParams p = with_logprobs(variant(f, 0), 4);
    p.cache_salt = salt;
    return drain(*s.engine->submit(p));
  };
  const Result a = run("a");
  EXPECT_EQ(a.cached, 0);
  EXPECT_EQ(run("b").cached, 0) << "another salt";
  EXPECT_EQ(run("").cached, 0) << "no salt";
  const Result a2 = run("a");
  EXPECT_EQ(a2.cached, 8);
  expect_same(a, a2, "same salt");
}

}  // namespace
}  // namespace moe
