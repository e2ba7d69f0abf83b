// Expert-parallel load balancing across real ranks (mpirun -np 1..4; the tests need
// two ranks or more and say so on one):
//  1. Any placement with any replicas gives, with alltoall and alltoall-ll, bitwise
//     the single-rank layer's output on every fixture family, and so does a layer
//     that rebalanced to another placement between two calls (with a call in
//     between while the weights were in flight); allreduce and allgather within fp32
//     summation-order rounding.
//  2. A whole model rebalancing online every 2 steps (--eplb-interval 2 with
//     redundant slots) gives bitwise the one-rank logits at every step with the
//     all-to-all strategies (also under --dp 2), and the one-rank tokens with
//     allgather and under --tp 2 --ep 2 (MoE-TP sums partials: rounding differs).
//  3. A placement file that differs between ranks is an error on every rank.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "comm/communicator.h"
#include "core/atomic_file.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "model/model.h"
#include "moe/ep_layer.h"
#include "moe/placement_file.h"
#include "moe/slot_weights.h"
#include "runtime/generate.h"
#include "fixture_cases.h"
#include "../test_model_util.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

// A random placement over ep ranks: each expert on one random rank (every rank gets
// at least one), then `extra` replicas on ranks that do not hold the expert yet.
// Same seed, same placement on every rank.
std::vector<std::vector<int32_t>> random_ranks(int64_t E, int ep, int64_t extra, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<int32_t>> r(ep);
  for (int64_t e = 0; e < E; ++e) r[e < ep ? e : g() % ep].push_back(static_cast<int32_t>(e));
  for (int64_t i = 0; i < extra; ++i) {
    const int32_t e = static_cast<int32_t>(g() % E);
    const int q = static_cast<int>(g() % ep);
    if (std::find(r[q].begin(), r[q].end(), e) == r[q].end()) r[q].push_back(e);
  }
  for (auto& v : r) std::shuffle(v.begin(), v.end(), g);  // slot order need not follow ids
  return r;
}

std::pair<int64_t, int64_t> share(int64_t T) {
  const int R = world().size(), r = world().rank();
  return {T * r / R, T * (r + 1) / R - T * r / R};
}

void expect_output(const Tensor& y, const Tensor& ref, int64_t first, bool bitwise) {
  const int64_t n = y.dim(0), H = y.dim(1);
  for (int64_t i = 0; i < n * H; ++i) {
    const float got = y.data<float>()[i], want = ref.data<float>()[first * H + i];
    if (bitwise)
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "element " << i << ": " << got << " vs " << want;
    else
      ASSERT_NEAR(got, want, 1e-5 + 1e-5 * std::fabs(want)) << "element " << i;
  }
}

TEST(EplbLayer, AnyPlacementAndRebalanceGiveTheSingleRankOutput) {
  const int R = world().size(), rank = world().rank();
  if (R < 2) GTEST_SKIP() << "placements over EP ranks need 2 ranks or more";
  int checked = 0;
  for (const test::MoeCase& cs : test::moe_cases({33})) {
    Checkpoint ck = Checkpoint::open(cs.dir);
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    if (cfg.n_experts < R) continue;
    const Tensor x = SafetensorsFile::open(cs.input)->view("hidden_states").clone();
    MoeLayer single(cfg, load_moe_layer(ck, cfg, cs.layer, MlpLoadOptions{}));
    const Tensor ref = single.forward(x);
    const auto [first, n] = share(x.dim(0));
    const Tensor mine = x.slice_rows(first, first + n).clone();
    const auto weights = [&](const Placement& p) {
      return load_slot_weights(p, rank, [&](int64_t b, int64_t e) {
        MlpLoadOptions lo;
        lo.expert_begin = b;
        lo.expert_end = e;
        return load_moe_layer(ck, cfg, cs.layer, lo);
      });
    };
    for (uint64_t seed = 1; seed <= 2; ++seed)
      for (int64_t extra : {int64_t{0}, int64_t{R}, 2 * cfg.n_experts}) {
        const Placement pl = Placement::from_ranks(cfg.n_experts, 1, random_ranks(cfg.n_experts, R, extra, seed));
        const Placement next =
            Placement::from_ranks(cfg.n_experts, 1, random_ranks(cfg.n_experts, R, extra + 3, seed + 100));
        for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllToAllLL, MoeComm::AllGather}) {
          SCOPED_TRACE(::testing::Message() << cs.dir << " " << moe_comm_name(c) << " " << pl.describe() << " -> "
                                            << next.describe());
          EpOptions o;
          o.comm = c;
          o.max_tokens_per_rank = 40;
          EpMoeLayer layer(MoeLayer(cfg, weights(pl)), world(), pl, o);
          const bool bitwise = c != MoeComm::AllGather;
          expect_output(layer.forward(mine), ref, first, bitwise);
          layer.begin_rebalance(next);
          expect_output(layer.forward(mine), ref, first, bitwise);  // old slots while the new ones travel
          const RebalanceStats st = layer.finish_rebalance();
          EXPECT_EQ(st.slots_copied + st.slots_received, next.n_local(rank));
          EXPECT_TRUE(layer.placement() == next);
          expect_output(layer.forward(mine), ref, first, bitwise);
          ++checked;
        }
      }
  }
  EXPECT_GT(checked, 30);
}

TEST(EplbModel, OnlineRebalancingKeepsTheOneRankLogitsAtEveryStep) {
  const int R = world().size();
  if (R < 2) GTEST_SKIP() << "placements over EP ranks need 2 ranks or more";
  for (const auto& f : test::model_fixtures()) {
    if (f.name != "qwen3_moe" && f.name != "deepseek_v3" && f.name != "mixtral") continue;
    auto ref = test::load_model(f.dir);
    GenerateOptions go;
    go.max_new_tokens = 9;
    go.ignore_eos = true;
    go.keep_logits = true;
    const GenerateResult want = generate(*ref, f.prompts, go);
    struct Layout {
      int ep, tp, dp;
      MoeComm comm;
      bool bitwise;  // the all-to-all strategies without MoE-TP
      int attn_tp = 1;
    };
    std::vector<Layout> layouts = {{R, 1, 1, MoeComm::AllToAll, true}, {R, 1, 1, MoeComm::Auto, true},
                                   {R, 1, 1, MoeComm::AllGather, false}};
    if (R == 4) {
      layouts.push_back({2, 2, 1, MoeComm::Auto, false});
      layouts.push_back({4, 1, 2, MoeComm::AllToAll, true});
      layouts.push_back({4, 1, 2, MoeComm::AllToAll, false, 2});  // attention TP in each replica
    }
    // Attention TP over the EP group (these fixtures' 4 heads split 2 or 4 ways): the
    // routed experts move between slots while heads, KV and lm_head stay split.
    if (R == 2 || R == 4) layouts.push_back({R, 1, 1, MoeComm::Auto, false, R});
    for (const Layout& lay : layouts) {
      const MoeComm c = lay.comm;
      SCOPED_TRACE(fmt::format("{} --ep {} --tp {} --dp {} --attn-tp {} --moe-comm {}", f.name, lay.ep, lay.tp,
                               lay.dp, lay.attn_tp, moe_comm_name(c)));
      ModelOptions o;
      o.n_slots = 3;
      o.max_seq = 32;
      o.world = &world();
      o.par = {lay.ep, lay.tp, lay.dp, lay.attn_tp};
      o.ep.comm = c;
      const int64_t E = ref->config().moe.n_experts;
      o.eplb.redundant = lay.ep + (lay.ep - E % lay.ep) % lay.ep;  // (E + R) divides by ep
      o.eplb.interval = 2;
      auto m = Model::load(f.dir, o);
      const GenerateResult got = generate(*m, f.prompts, go);
      ASSERT_NE(m->eplb_report(), nullptr);
      EXPECT_GE(m->eplb_report()->rebalances, 4);
      EXPECT_GT(m->eplb_report()->slots_moved, 0) << "the load should have moved some expert";
      for (size_t i = 0; i < f.prompts.size(); ++i) {
        EXPECT_EQ(got.tokens[i], want.tokens[i]) << "prompt " << i;
        // Under DP a rank keeps the logits of its replica's requests only.
        if (!lay.bitwise || got.step_logits[i].empty()) continue;
        ASSERT_EQ(got.step_logits[i].size(), want.step_logits[i].size());
        EXPECT_EQ(std::memcmp(got.step_logits[i].data(), want.step_logits[i].data(),
                              want.step_logits[i].size() * sizeof(float)),
                  0)
            << "prompt " << i << ": logits differ from one rank's";
      }
    }
  }
}

TEST(EplbModel, PlacementFilesThatDifferBetweenRanksAreAnErrorEverywhere) {
  const int R = world().size(), rank = world().rank();
  if (R < 2) GTEST_SKIP() << "placements over EP ranks need 2 ranks or more";
  const std::string dir = std::string(MOE_FIXTURES_DIR) + "/qwen3_moe";
  const int64_t E = 60;
  PlacementFile f;
  f.n_experts = E;
  f.ep = R;
  f.layers = {0, 2};
  for (int i = 0; i < 2; ++i) f.ranks.push_back(random_ranks(E, R, 4, rank == 1 ? 7 : 3));  // rank 1 differs
  const std::string path = ::testing::TempDir() + fmt::format("moe_eplb_placement_rank{}.json", rank);
  write_file_atomic(path, to_json(f).dump(1), "placement");
  ModelOptions o;
  o.max_seq = 16;
  o.world = &world();
  o.par = {R, 1, 1};
  o.eplb.placement_file = path;
  try {
    Model::load(dir, o);
    ADD_FAILURE() << "differing placement files loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("placement file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe
