// Whole models across real ranks (mpirun -np 1..4): every parallel layout gives the
// tokens of one rank, and pure EP gives bitwise-identical logits with the all-to-all
// strategies (EP invariance; allreduce/allgather within fp32 summation-order rounding).
//   --ep R (replicated attention), every strategy      all fixtures
//   --tp 2 --ep 2 [--dp 2] (heads split, MoE-TP)      world 4
//   --dp 2 --ep R, one replica with no prompt         even worlds
//   FP8 checkpoints in bf16 (codes kept): every layout  ModelFp8
//   --tp 3 on a model with 4 heads                     world 3: a clear error
//   --kv-cache-dtype bf16 under --ep R (all-to-all)   the one-rank bf16-cache logits, bitwise
//   --ep R --attn-tp R (attention, KV, shared experts, dense MLPs, vocab split R ways;
//     the seed's vLLM layout)                           every fixture; R = 3: errors
//   the collectives of one --attn-tp decode step        one all-reduce of the embedding,
//                                                       one per attention and per MLP
//                                                       block, one gather
//   greedy / top-k rows under --attn-tp                 each rank sends its k best;
//                                                       the token of the whole row
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "comm/communicator.h"
#include "loader/checkpoint.h"
#include "model/registry.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "../test_model_util.h"
#include "counting_comm.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

struct Layout {
  int ep, tp, dp;
  MoeComm comm;
  int attn_tp = 1;
};

std::unique_ptr<Model> load(const std::string& dir, const Layout& l, int64_t n_prompts, DType kv = DType::F32) {
  ModelOptions o;
  o.kv_cache_dtype = kv;
  o.n_slots = (n_prompts + l.dp - 1) / l.dp;
  o.max_seq = 32;
  o.world = &world();
  o.par = {l.ep, l.tp, l.dp, l.attn_tp};
  o.ep.comm = l.comm;
  return Model::load(dir, o);
}

GenerateResult greedy(Model& m, const std::vector<std::vector<int32_t>>& prompts, int64_t n = 16) {
  GenerateOptions go;
  go.max_new_tokens = n;
  go.ignore_eos = true;
  return generate(m, prompts, go);
}

std::string describe(const Layout& l) {
  return fmt::format("--ep {} --tp {} --dp {} --attn-tp {} --moe-comm {}", l.ep, l.tp, l.dp, l.attn_tp,
                     moe_comm_name(l.comm));
}

TEST(ModelEp, EveryStrategyGivesTheSingleRankResult) {
  const int R = world().size();
  for (const auto& f : test::model_fixtures()) {
    if (f.name.find("_fused") != std::string::npos) continue;
    auto ref = test::load_model(f.dir);  // this rank alone
    const Tensor ref_logits = prefill_logits(*ref, f.prompts);
    for (MoeComm c : {MoeComm::AllReduce, MoeComm::AllGather, MoeComm::AllToAll, MoeComm::AllToAllLL}) {
      const Layout l{R, 1, 1, c};
      SCOPED_TRACE(f.name + " " + describe(l));
      auto m = load(f.dir, l, 3);
      const double d = test::max_logit_diff(prefill_logits(*m, f.prompts), ref_logits, f.prompts);
      if (c == MoeComm::AllToAll || c == MoeComm::AllToAllLL) EXPECT_EQ(d, 0.0) << "EP invariance";
      else EXPECT_LE(d, 1e-5);
      auto m2 = load(f.dir, l, 3);
      const GenerateResult r = greedy(*m2, f.prompts);
      for (size_t i = 0; i < f.greedy.size(); ++i) EXPECT_EQ(r.tokens[i], f.greedy[i]) << "prompt " << i;
    }
  }
}

// A bf16 KV cache on every rank: replicated attention under --ep R (all-to-all, EP
// invariant) gives bitwise the one-rank bf16-cache logits (each rank stores the same
// rounded K/V). (Not --tp: o_proj's all-reduce order moves the logits by fp32 rounding,
// and mixtral's near-tied routing at prompt 2 position 3, which the bf16 cache already
// flips, could flip back: no tight bound to state.)
TEST(ModelEp, Bf16KvCacheGivesTheSingleRankBf16Result) {
  const int R = world().size();
  for (const auto& f : test::model_fixtures()) {
    if (f.name.find("_fused") != std::string::npos) continue;
    ModelOptions one;
    one.n_slots = 3;
    one.max_seq = 32;
    one.kv_cache_dtype = DType::BF16;
    const Tensor ref = prefill_logits(*Model::load(f.dir, one), f.prompts);  // this rank alone
    for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllToAllLL}) {
      const Layout l{R, 1, 1, c};
      SCOPED_TRACE(f.name + " " + describe(l) + " --kv-cache-dtype bf16");
      auto m = load(f.dir, l, 3, DType::BF16);
      ASSERT_EQ(m->cache().dtype(), DType::BF16);
      EXPECT_EQ(test::max_logit_diff(prefill_logits(*m, f.prompts), ref, f.prompts), 0.0) << "EP invariance";
    }
  }
}

TEST(ModelTp, TensorParallelAttentionWithExpertParallelMoe) {
  if (world().size() != 4) GTEST_SKIP() << "--tp 2 --ep 2 needs 4 ranks";
  for (const auto& f : test::model_fixtures()) {
    if (f.name.find("_fused") != std::string::npos) continue;
    for (const Layout& l : {Layout{2, 2, 1, MoeComm::Auto}, Layout{2, 2, 1, MoeComm::AllReduce},
                            Layout{2, 2, 2, MoeComm::AllToAll}}) {
      SCOPED_TRACE(f.name + " " + describe(l));
      auto m = load(f.dir, l, 3);
      EXPECT_LE(test::max_logit_diff(prefill_logits(*m, f.prompts), f.logits, f.prompts), 1e-4);
      auto m2 = load(f.dir, l, 3);
      const GenerateResult r = greedy(*m2, f.prompts);
      for (size_t i = 0; i < f.greedy.size(); ++i) EXPECT_EQ(r.tokens[i], f.greedy[i]) << "prompt " << i;
    }
  }
}

// Whether R attention-TP ranks fit fixture `dir`: query heads split, KV heads split or
// replicated, the shared experts' and dense MLPs' intermediate sizes split.
bool attn_tp_fits(const std::string& dir, int R) {
  const ModelConfig c = model_config_from_hf(Checkpoint::open(dir).config());
  const bool kv = c.attention == AttentionKind::Mla || c.n_kv_heads % R == 0 || R % c.n_kv_heads == 0;
  const bool dense = c.moe.dense_intermediate_size % R == 0;  // 0: no dense layer
  return c.n_heads % R == 0 && kv && c.moe.shared_intermediate_size % R == 0 && dense;
}

// The seed's vLLM layout: attention TP = EP = the world. Heads (and GQA's KV cache) split
// R ways (2 KV heads over 4 ranks: each held by 2), routed experts whole and EP, shared
// experts and dense MLPs split, lm_head split by vocabulary. With allreduce (auto) the
// routed and shared partials meet in one all-reduce; with the all-to-all strategies each
// rank dispatches its share of the rows. With --dp 2 (4 ranks) attention is split over
// each replica's 2 ranks. Against transformers' logits (f32 within 1e-4) and greedy
// tokens, and the same bits on a second run. Where R does not fit (3 ranks, 4 heads): an
// error naming it.
TEST(ModelAttnTp, EveryFamilyWithAttentionTpOverTheEpGroup) {
  const int R = world().size();
  if (R == 1) GTEST_SKIP() << "--attn-tp needs 2 or more ranks";
  std::vector<Layout> layouts = {{R, 1, 1, MoeComm::Auto, R}, {R, 1, 1, MoeComm::AllToAll, R},
                                 {R, 1, 1, MoeComm::AllToAllLL, R}, {R, 1, 1, MoeComm::AllGather, R}};
  if (R == 4) {
    layouts.push_back({R, 1, 2, MoeComm::AllToAll, 2});
    layouts.push_back({R, 1, 2, MoeComm::Auto, 2});
  }
  int ran = 0;
  for (const auto& f : test::model_fixtures()) {
    if (f.name.find("_fused") != std::string::npos) continue;
    Tensor allreduce;  // layouts[0]'s logits: the all-to-all strategies equal them within f32 rounding
    for (const Layout& l : layouts) {
      SCOPED_TRACE(f.name + " " + describe(l));
      if (!attn_tp_fits(f.dir, l.attn_tp)) {
        try {
          load(f.dir, l, 3);
          ADD_FAILURE() << "expected an error";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(fmt::format("--attn-tp {} does not", l.attn_tp)), std::string::npos)
              << e.what();
        }
        continue;
      }
      ++ran;
      auto m = load(f.dir, l, 3);
      const Tensor got = prefill_logits(*m, f.prompts);
      EXPECT_LE(test::max_logit_diff(got, f.logits, f.prompts), 1e-4);
      if (!allreduce.defined()) allreduce = got;
      else if (l.dp == 1) {
        EXPECT_LE(test::max_logit_diff(got, allreduce, f.prompts), 1e-5) << "vs allreduce";
      }
      auto again = load(f.dir, l, 3);
      EXPECT_EQ(test::max_logit_diff(prefill_logits(*again, f.prompts), got, f.prompts), 0.0) << "run to run";
      auto m2 = load(f.dir, l, 3);
      const GenerateResult r = greedy(*m2, f.prompts);
      for (size_t i = 0; i < f.greedy.size(); ++i) EXPECT_EQ(r.tokens[i], f.greedy[i]) << "prompt " << i;
    }
  }
  if (R == 2 || R == 4) {
    EXPECT_GE(ran, 6 * static_cast<int>(layouts.size())) << "every fixture family fits 2 and 4 ranks";
  }
}

// The collectives one decode step of `dir` runs under `par`, counted on this rank: a
// prefill of 3 tokens first (not counted), then one token.
struct CountedStep {
  test::CountingComm::Tally tally;
  ModelConfig config;
  int64_t vocab_out = 0;  // columns of the step's logits
};
CountedStep count_decode_step(const std::string& dir, const ParallelConfig& par) {
  auto tally = std::make_shared<test::CountingComm::Tally>();
  test::CountingComm counting(world(), tally);
  ModelOptions o;
  o.n_slots = 1;
  o.max_seq = 32;
  o.world = &counting;
  o.par = par;
  auto m = Model::load(dir, o);
  StepBatch b;
  b.tokens = {5, 9, 11};
  b.positions = {0, 1, 2};
  b.seqs = {{/*slot=*/0, /*first=*/0, /*n=*/3, /*start_pos=*/0}};
  b.logit_rows = {2};
  m->forward(b);
  tally->clear();
  b.tokens = {7};
  b.positions = {3};
  b.seqs = {{/*slot=*/0, /*first=*/0, /*n=*/1, /*start_pos=*/3}};
  b.logit_rows = {0};
  const Tensor logits = m->forward(b);
  return {*tally, m->config(), logits.dim(1)};
}

// The collectives of the seed's layout, counted on every rank: a decode step runs one
// all-reduce of the vocabulary-parallel embedding's rows, then per layer one after
// attention (row-parallel o_proj) and one for the MLP block (MoE: routed + shared
// partials together; dense: the row-parallel down_proj), and one all-gather of the
// vocabulary-parallel logits. Nothing else.
TEST(ModelAttnTp, OneAllReducePerAttentionAndPerMlpBlock) {
  const int R = world().size();
  if (R != 2 && R != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const char* name : {"deepseek_v3", "qwen2_moe"}) {  // MLA + dense layer + shared; GQA + gated shared
    SCOPED_TRACE(name);
    const CountedStep c = count_decode_step(test::fixtures_dir() + "/" + name, {R, 1, 1, R});
    EXPECT_EQ(c.vocab_out, c.config.vocab_size);
    const test::CountingComm::Tally want = {{"all_reduce", 2 * c.config.n_layers + 1}, {"all_gather_v", 1}};
    EXPECT_EQ(c.tally, want);
  }
}

// What `moe-ep plan` counts for the replicated layout (--ep R, auto): at decode sizes one
// all-gather per MoE layer (the slot gather), none for attention or a dense layer.
TEST(ModelAttnTp, ReplicatedAttentionRunsOneAllGatherPerMoeLayer) {
  const int R = world().size();
  if (R == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const CountedStep c = count_decode_step(test::fixtures_dir() + "/deepseek_v3", {R, 1, 1});  // layer 0 dense
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.config.n_layers; ++l) moe_layers += c.config.moe.is_moe_layer(l);
  ASSERT_LT(moe_layers, c.config.n_layers);
  const test::CountingComm::Tally want = {{"all_gather_v", moe_layers}};
  EXPECT_EQ(c.tally, want);
}

// What `moe-ep plan` counts for MoE-TP (--tp R): one all-reduce per layer (the
// row-parallel o_proj) and, per MoE layer at decode, alltoall-ll's dispatch
// (point-to-point) and combine (all-to-all) and the all-gather of the rows' outputs.
TEST(ModelTp, MoeTpDecodeStepRunsThePlansCollectives) {
  const int R = world().size();
  if (R != 2 && R != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const char* name : {"deepseek_v3", "qwen3_moe"}) {  // a dense first layer; mlp_only_layers
    SCOPED_TRACE(name);
    const CountedStep c = count_decode_step(test::fixtures_dir() + "/" + name, {1, R, 1});
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < c.config.n_layers; ++l) moe_layers += c.config.moe.is_moe_layer(l);
    ASSERT_LT(moe_layers, c.config.n_layers);
    const test::CountingComm::Tally want = {{"all_reduce", c.config.n_layers},
                                            {"send_recv", moe_layers},
                                            {"all_to_all", moe_layers},
                                            {"all_gather_v", moe_layers}};
    EXPECT_EQ(c.tally, want);
  }
}

TEST(ModelDp, ReplicasWithAndWithoutRequestsStayInLockStep) {
  const int R = world().size();
  if (R % 2 != 0) GTEST_SKIP() << "--dp 2 needs an even number of ranks";
  for (const auto& f : test::model_fixtures()) {
    if (f.name != "qwen3_moe" && f.name != "deepseek_v3" && f.name != "ernie4_5_moe" && f.name != "mixtral_gelu" &&
        f.name != "deepseek_v3_fp8" && f.name != "qwen3_moe_fp8")
      continue;
    for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllGather, MoeComm::Auto}) {
      const Layout l{R, 1, 2, c};
      SCOPED_TRACE(f.name + " " + describe(l));
      // One prompt: replica 1 has no request and runs every step with 0 tokens.
      auto one = load(f.dir, l, 1);
      const GenerateResult r1 = greedy(*one, {f.prompts[2]});
      EXPECT_EQ(r1.tokens[0], f.greedy[2]);
      // All three: prompts 0 and 2 on replica 0, prompt 1 on replica 1 (different lengths, so
      // the replicas hold different token counts in every step).
      auto all = load(f.dir, l, 3);
      const GenerateResult r3 = greedy(*all, f.prompts);
      for (size_t i = 0; i < f.greedy.size(); ++i) EXPECT_EQ(r3.tokens[i], f.greedy[i]) << "prompt " << i;
      auto lg = load(f.dir, l, 3);
      EXPECT_LE(test::max_logit_diff(prefill_logits(*lg, f.prompts), f.logits, f.prompts), 1e-4);
    }
  }
}

TEST(ModelDp, SeededSamplingIsTheSameOnEveryLayout) {
  const int R = world().size();
  const auto fx = test::model_fixtures();
  const auto& f = fx[0];
  // top_k 30 gathers whole rows under --attn-tp (30 pairs are no smaller than a rank's
  // slice of this vocabulary); top_k 5 gathers each rank's 5 best.
  for (int64_t top_k : {30, 5}) {
    GenerateOptions go;
    go.max_new_tokens = 8;
    go.ignore_eos = true;
    go.sampling.temperature = 1.0;
    go.sampling.top_k = top_k;
    go.sampling.top_p = 0.9;
    go.sampling.seed = 11;
    auto ref = test::load_model(f.dir);
    const GenerateResult want = generate(*ref, f.prompts, go);
    std::vector<Layout> layouts = {{R, 1, 1, MoeComm::AllToAll}};
    if (R % 2 == 0) layouts.push_back({R, 1, 2, MoeComm::AllToAll});
    // Vocabulary-parallel lm_head: the seeded top-k draw sees the gathered logits.
    if (R > 1 && attn_tp_fits(f.dir, R)) layouts.push_back({R, 1, 1, MoeComm::Auto, R});
    for (const Layout& l : layouts) {
      SCOPED_TRACE(describe(l) + fmt::format(" top_k {}", top_k));
      auto m = load(f.dir, l, 3);
      EXPECT_EQ(generate(*m, f.prompts, go).tokens, want.tokens);
    }
  }
}

// Vocabulary-parallel lm_head, rows whose caller reads only their k best
// (StepBatch::logit_top_k): each rank sends its k best (value, id) pairs, not its
// slice. The row's k best come back bit for bit, the rest of the row is -inf or a true
// logit, and greedy and seeded top-k / top-p draws pick the token of the whole row.
TEST(ModelAttnTp, VocabParallelTopKPicksTheTokenOfTheWholeRow) {
  const int R = world().size();
  if (R == 1) GTEST_SKIP() << "--attn-tp needs 2 or more ranks";
  int ran = 0;
  for (const char* name : {"chat_qwen3", "deepseek_v3", "qwen3_moe"}) {
    const std::string dir = test::fixtures_dir() + "/" + name;
    if (!attn_tp_fits(dir, R)) continue;
    ++ran;
    SCOPED_TRACE(name);
    auto sent = std::make_shared<test::CountingComm::Tally>();
    test::CountingComm counting(world(), std::make_shared<test::CountingComm::Tally>(), sent);
    ModelOptions o;
    o.n_slots = 3;
    o.max_seq = 32;
    o.world = &counting;
    o.par = {R, 1, 1, R};
    auto m = Model::load(dir, o);
    const int64_t V = m->config().vocab_size;
    StepBatch b;  // three prompts of 4, 2 and 3 tokens; the last token of each
    b.tokens = {5, 9, 11, 3, 7, 1, 2, 8, 4};
    b.positions = {0, 1, 2, 3, 0, 1, 0, 1, 2};
    b.seqs = {{0, 0, 4, 0}, {1, 4, 2, 0}, {2, 6, 3, 0}};
    b.logit_rows = {3, 5, 8};
    const Tensor whole = m->forward(b);
    // The k of each row (0: the whole row); the largest fits the smallest rank's slice
    // (2 k < V / R).
    const int32_t big = static_cast<int32_t>(std::max<int64_t>(1, (V / R - 1) / 2));
    for (const std::vector<int32_t>& ks : {std::vector<int32_t>{1, 0, big}, std::vector<int32_t>{big, 3, 1}}) {
      b.logit_top_k = ks;
      sent->clear();
      const Tensor part = m->forward(b);  // the same positions again: the cache gets the same values
      // Each rank sent min(k, V_r) pairs of 8 bytes for a limited row, its slice for the others.
      const auto [vb, ve] = vocab_range(V, counting.rank(), R);
      int64_t bytes = 0;
      for (int32_t k : ks) bytes += k > 0 ? std::min<int64_t>(k, ve - vb) * 8 : (ve - vb) * 4;
      EXPECT_EQ((*sent)["all_gather_v"], bytes);
      for (int64_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(fmt::format("row {} k {}", i, ks[i]));
        const float* w = whole.data<float>() + i * V;
        const float* p = part.data<float>() + i * V;
        if (ks[i] == 0) {
          EXPECT_EQ(std::memcmp(p, w, V * sizeof(float)), 0) << "the whole row";
          continue;
        }
        std::vector<int32_t> order(V);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return logit_before(w, a, c); });
        for (int32_t j = 0; j < ks[i]; ++j)
          EXPECT_EQ(std::memcmp(&p[order[j]], &w[order[j]], sizeof(float)), 0) << "the " << j << "-th best";
        for (int64_t v = 0; v < V; ++v)
          EXPECT_TRUE(p[v] == -std::numeric_limits<float>::infinity() || p[v] == w[v]) << "id " << v;
        SamplingParams greedy;
        EXPECT_EQ(sample_token(p, V, greedy, 0, 0), sample_token(w, V, greedy, 0, 0));
        for (uint64_t seed = 0; seed < 20; ++seed) {
          SamplingParams s;
          s.temperature = 0.7;
          s.top_k = ks[i];
          s.top_p = seed % 2 ? 0.8 : 1.0;
          s.seed = seed;
          EXPECT_EQ(sample_token(p, V, s, 0, seed), sample_token(w, V, s, 0, seed)) << "seed " << seed;
        }
      }
    }
  }
  if (R == 2 || R == 4) {
    EXPECT_EQ(ran, 3);
  }
}

// The FP8 checkpoints in bf16 (codes kept e4m3, dequantised inside every GEMM:
// attention, dense MLPs, shared and routed experts, lm_head where quantised): pure EP
// with the all-to-all strategies gives the one-rank bits; TP and DP layouts stay within
// the single-rank bf16 bound of transformers' logits (2 % of the largest |logit|, one
// outlier row allowed: test_model.cpp Bf16LogitsWithinBound) and every layout gives the
// one-rank tokens.
TEST(ModelFp8, Bf16CodesOnEveryLayout) {
  const int R = world().size();
  int fixtures = 0;
  for (const auto& f : test::model_fixtures()) {
    if (!f.name.ends_with("_fp8")) continue;
    ++fixtures;
    auto ref = test::load_model(f.dir, DType::BF16);
    const Tensor ref_logits = prefill_logits(*ref, f.prompts);
    auto ref2 = test::load_model(f.dir, DType::BF16);
    const GenerateResult want = greedy(*ref2, f.prompts);
    std::vector<Layout> layouts = {{R, 1, 1, MoeComm::AllToAll}, {R, 1, 1, MoeComm::AllToAllLL}};
    if (R == 4) layouts.push_back({2, 2, 1, MoeComm::Auto});
    if (R % 2 == 0) layouts.push_back({R, 1, 2, MoeComm::AllToAll});
    for (Layout l : layouts) {
      SCOPED_TRACE(f.name + " bf16 " + describe(l));
      auto load_bf16 = [&] {
        ModelOptions o;
        o.dtype = DType::BF16;
        o.n_slots = (3 + l.dp - 1) / l.dp;
        o.max_seq = 32;
        o.world = &world();
        o.par = {l.ep, l.tp, l.dp};
        o.ep.comm = l.comm;
        return Model::load(f.dir, o);
      };
      auto m = load_bf16();
      const Tensor got = prefill_logits(*m, f.prompts);
      if (l.tp == 1 && l.dp == 1) {
        EXPECT_EQ(test::max_logit_diff(got, ref_logits, f.prompts), 0.0) << "EP invariance";
      }
      EXPECT_LE(test::bf16_rows(got, f.logits, f.prompts).outliers, 1);
      auto m2 = load_bf16();
      EXPECT_EQ(greedy(*m2, f.prompts).tokens, want.tokens);
    }
  }
  EXPECT_GE(fixtures, 4);
}

TEST(ModelTp, TpNotDividingHeadsIsAnError) {
  if (world().size() != 3) GTEST_SKIP() << "needs 3 ranks";
  const std::string dir = test::fixtures_dir() + "/qwen2_moe";  // 4 heads, 2 key/value heads
  try {
    load(dir, {1, 3, 1, MoeComm::Auto}, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 3 does not fit the model's 4 attention heads and 2 key/value heads"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moe
