// Expert placement and load balancing on one process: Placement with replicas, the
// EPLB policy's properties and hand-worked cases, keeping experts in place, the load
// window, expert copies in every weight format, and the files' bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_int4.h"
#include "moe/eplb.h"
#include "moe/load_window.h"
#include "moe/placement_file.h"
#include "test_util.h"

namespace moe {
namespace {

using nlohmann::json;

// The statement throws moe::Error whose message contains `words`.
#define EXPECT_THROW_MSG(stmt, words)                                                       \
  do {                                                                                      \
    try {                                                                                   \
      (void)(stmt);                                                                         \
      ADD_FAILURE() << #stmt " did not throw";                                              \
    } catch (const Error& e) {                                                              \
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();          \
    }                                                                                       \
  } while (0)

TEST(Placement, ReplicasAndSlotsFromRanks) {
  // Expert 0 twice (ranks 0 and 1), expert 3 on rank 1 before expert 1.
  const Placement p = Placement::from_ranks(4, 1, {{0, 2}, {3, 1, 0}});
  EXPECT_EQ(p.n_slots(), 5);
  EXPECT_EQ(p.begin(1), 2);
  EXPECT_EQ(p.end(1), 5);
  EXPECT_EQ(p.logical(2), 3);
  EXPECT_EQ(p.n_replicas(0), 2);
  EXPECT_EQ(p.replicas(0)[0], 0);
  EXPECT_EQ(p.replicas(0)[1], 4);
  EXPECT_FALSE(p.identity());
  EXPECT_TRUE(p.replicated());
  // The pick spreads salts over the replicas and keeps single experts on their slot.
  EXPECT_EQ(p.pick(0, 0), 0);
  EXPECT_EQ(p.pick(0, 1), 4);
  EXPECT_EQ(p.pick(0, 7), 4);
  EXPECT_EQ(p.pick(3, 5), 2);
  EXPECT_EQ(p.rank_experts(1), (std::vector<int32_t>{3, 1, 0}));
  EXPECT_TRUE(Placement::from_ranks(6, 1, {{0, 1, 2}, {3, 4, 5}}).identity());
  EXPECT_TRUE(Placement::from_ranks(6, 1, {{0, 1, 2}, {3, 4, 5}}) == Placement::contiguous(6, 2, 1));
}

TEST(Placement, BadRankListsNameTheProblem) {
  EXPECT_THROW_MSG(Placement::from_ranks(4, 1, {{0, 1}, {2}}), "expert 3 has no slot");
  EXPECT_THROW_MSG(Placement::from_ranks(4, 1, {{0, 1, 1}, {2, 3}}), "two replicas of expert 1");
  EXPECT_THROW_MSG(Placement::from_ranks(4, 1, {{0, 1, 2, 3}, {}}), "EP rank 1 holds no expert");
  EXPECT_THROW_MSG(Placement::from_ranks(4, 1, {{0, 1, 4}, {2, 3}}), "expert 4, outside [0, 4)");
}

// Worked by hand (see moe/eplb.h): E=4, ep=2, R=2, load [10, 1, 1, 1]. Replicas go to
// expert 0 (10 > 1), then, expert 0 holding ranks-per-node = 2 replicas already, to
// expert 1 (ties to the lower id). Slots (load per replica) 5, 5, .5, .5, 1, 1 packed
// heaviest first onto the lighter rank, never two of one expert on a rank:
// rank 0 {0, 1, 2}, rank 1 {0, 1, 3}: 6.5 rows each.
TEST(Eplb, HandWorkedGlobalCase) {
  const auto r = eplb_place({10, 1, 1, 1}, {2, 2, 1, 1});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r[1], (std::vector<int32_t>{0, 1, 3}));
  EXPECT_DOUBLE_EQ(placement_imbalance(Placement::from_ranks(4, 1, r), {10, 1, 1, 1}), 1.0);
  // Without redundancy the heavy expert sets the pace: rank 0 {0}, ... 10 vs 3 rows.
  const auto r0 = eplb_place({10, 1, 1, 1}, {2, 0, 1, 1});
  EXPECT_EQ(r0[0], (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(r0[1], (std::vector<int32_t>{1, 2}));
}

// Hierarchical: 8 experts in 4 groups of 2 over 2 nodes of 2 ranks. Group loads
// 9+9, 1+1, 5+5, 3+3 -> node 0 gets groups {0, 1} (18 + 2) and node 1 {2, 3} (10 + 6),
// so every node holds whole groups.
TEST(Eplb, HierarchicalKeepsGroupsOnANode) {
  const std::vector<double> load = {9, 9, 1, 1, 5, 5, 3, 3};
  const auto r = eplb_place(load, {4, 0, 2, 4});
  std::vector<int32_t> node0, node1;
  for (int q : {0, 1}) node0.insert(node0.end(), r[q].begin(), r[q].end());
  for (int q : {2, 3}) node1.insert(node1.end(), r[q].begin(), r[q].end());
  std::sort(node0.begin(), node0.end());
  std::sort(node1.begin(), node1.end());
  EXPECT_EQ(node0, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(node1, (std::vector<int32_t>{4, 5, 6, 7}));
}

TEST(Eplb, PropertiesOnSkewedLoads) {
  std::mt19937_64 g(5);
  int cases = 0;
  for (int64_t E : {8, 16, 60, 128})
    for (int ep : {2, 3, 4, 8})
      for (int64_t extra : {0, 1, 2}) {
        const int64_t R = ep * extra + (ep - E % ep) % ep;
        if ((E + R) / ep > E) continue;
        for (double s : {0.0, 0.8, 1.2, 2.0}) {
          std::vector<double> load(E);
          std::vector<int64_t> order(E);
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), g);
          for (int64_t i = 0; i < E; ++i) load[order[i]] = std::round(1000.0 * std::pow(i + 1.0, -s)) + (g() % 3);
          SCOPED_TRACE(::testing::Message() << "E=" << E << " ep=" << ep << " R=" << R << " s=" << s);
          const auto ranks = eplb_place(load, {ep, R, 1, 1});
          const Placement p = Placement::from_ranks(E, 1, ranks);  // every expert placed, no doubles on a rank
          for (int q = 0; q < ep; ++q) EXPECT_EQ(p.n_local(q), (E + R) / ep) << "rank " << q;
          EXPECT_EQ(p.n_slots(), E + R);
          if (E % ep == 0) {
            EXPECT_LE(placement_imbalance(p, load), placement_imbalance(Placement::contiguous(E, ep, 1), load) + 1e-12);
          }
          // The same load gives the same placement (every rank computes it alone).
          EXPECT_EQ(eplb_place(load, {ep, R, 1, 1}), ranks);
          ++cases;
        }
      }
  EXPECT_GT(cases, 100);
}

TEST(Eplb, BadParametersAreErrors) {
  EXPECT_THROW_MSG(eplb_place(std::vector<double>(6, 1.0), {4, 1, 1, 1}), "do not divide over 4 EP ranks");
  EXPECT_THROW_MSG(eplb_place(std::vector<double>(4, 1.0), {2, 6, 1, 1}), "5 slots per rank exceed the 4 experts");
  EXPECT_THROW_MSG(eplb_place(std::vector<double>(8, 1.0), {4, 12, 2, 4}), "without two replicas");
  EXPECT_THROW_MSG(eplb_place({1, -1}, {2, 0, 1, 1}), "load of expert 1");
  EXPECT_THROW_MSG(eplb_place(std::vector<double>(8, 1.0), {4, 0, 3, 1}), "--nodes 3 must divide");
}

TEST(Eplb, KeepInPlaceRenumbersRanksToMoveLess) {
  const std::vector<std::vector<int32_t>> cur = {{0, 1}, {2, 3}, {4, 5}};
  std::vector<std::vector<int32_t>> next = {{4, 5}, {0, 1}, {2, 3}};  // the same, ranks renamed
  EXPECT_EQ(eplb_keep_in_place(next, cur, 1), 0);
  EXPECT_EQ(next, cur);
  std::vector<std::vector<int32_t>> next2 = {{4, 1}, {0, 3}, {2, 5}};
  const Placement before = Placement::from_ranks(6, 1, next2);
  const int64_t moved = eplb_keep_in_place(next2, cur, 1);
  EXPECT_EQ(moved, slots_moved(Placement::from_ranks(6, 1, cur), Placement::from_ranks(6, 1, next2)));
  EXPECT_LE(moved, slots_moved(Placement::from_ranks(6, 1, cur), before));
  EXPECT_EQ(moved, 3);  // one expert per rank has to move whatever the numbering
}

TEST(LoadWindow, SumsTheLastSteps) {
  std::vector<std::vector<int64_t>> c = {{0, 0}, {}};
  LoadWindow w(2, c);
  c[0] = {1, 0};
  w.push(c);
  c[0] = {1, 5};
  w.push(c);
  EXPECT_EQ(w.sum()[0], (std::vector<int64_t>{1, 5}));
  c[0] = {3, 5};
  w.push(c);  // the first step (1, 0) left the window
  EXPECT_EQ(w.sum()[0], (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(w.steps(), 2);
  w.clear(c);
  EXPECT_EQ(w.sum()[0], (std::vector<int64_t>{0, 0}));
}

// A long window is kept in 32 buckets of ceil(100 / 32) = 4 steps: after 200 steps of
// one row each (expert 0) and then 3 (expert 1), the sum holds between 97 and 100 steps
// and exactly the rows of the steps it says.
TEST(LoadWindow, LongWindowsKeepBucketsOfSteps) {
  std::vector<std::vector<int64_t>> c = {{0, 0}};
  LoadWindow w(100, c);
  for (int i = 0; i < 200; ++i) {
    ++c[0][i < 150 ? 0 : 1];
    w.push(c);
    ASSERT_GE(w.steps(), std::min(i + 1, 97));
    ASSERT_LE(w.steps(), std::min(i + 1, 100));
    ASSERT_EQ(w.sum()[0][0] + w.sum()[0][1], w.steps());
  }
  EXPECT_EQ(w.sum()[0][1], 50);  // the last 50 steps all went to expert 1
  EXPECT_EQ(w.sum()[0][0], w.steps() - 50);
}

// An expert copied piece by piece is the same expert, in every packed format.
TEST(ExpertPieces, CopyKeepsEveryFormat) {
  const int64_t n = 96, k = 128;
  std::vector<PackedExperts> formats;
  for (DType dt : {DType::F32, DType::BF16, DType::I8}) {
    formats.push_back(make_packed_experts(3, n, k, dt, true));
    for (int64_t e = 0; e < 3; ++e) pack_expert(formats.back(), e, test::random_f32({n, k}, 1.f, 20 + e));
  }
  formats.push_back(make_packed_experts_int4(3, n, k, true, 32));
  for (int64_t e = 0; e < 3; ++e) pack_expert(formats.back(), e, test::random_f32({n, k}, 1.f, 30 + e));
  for (const PackedExperts& p : formats) {
    SCOPED_TRACE(dtype_name(p.dtype) + std::string(p.int4_group ? " int4" : ""));
    PackedExperts q = make_packed_like(p, 2);
    copy_expert(q, 0, p, 2);
    EXPECT_EQ(expert_pieces(q, 0).size(), expert_pieces(p, 2).size());
    const Tensor a = unpack_expert(p, 2), b = unpack_expert(q, 0);
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    const Tensor z = unpack_expert(q, 1);  // never written: zeros
    for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<float>()[i], 0.f);
  }
}

TEST(PlacementFile, BadFilesNameTheField) {
  const json ok = {{"format", "moe-ep placement v1"},
                   {"experts", 4},
                   {"ep", 2},
                   {"layers", {{{"layer", 1}, {"ranks", {{0, 1}, {2, 3, 0}}}}}}};
  const PlacementFile f = parse_placement(ok, "t");
  EXPECT_EQ(f.layer_placement(1, 1).n_slots(), 5);
  EXPECT_THROW_MSG(f.layer_placement(0, 1), "no entry for MoE layer 0");
  json j = ok;
  j["layers"][0]["ranks"] = {{0, 1}, {2}};
  EXPECT_THROW_MSG(parse_placement(j, "t"), "expert 3 has no slot");
  j["layers"][0]["ranks"] = {{0, 0, 1}, {2, 3}};
  EXPECT_THROW_MSG(parse_placement(j, "t"), "two replicas of expert 0");
  j["layers"][0]["ranks"] = {{0, 1}, {2, 3}, {0}};
  EXPECT_THROW_MSG(parse_placement(j, "t"), "lists 3 EP ranks, the file says ep 2");
  j["layers"][0]["ranks"] = {{0, 1}, {2, 9}};
  EXPECT_THROW_MSG(parse_placement(j, "t"), "names expert 9");
  j = ok;
  j["format"] = "other";
  EXPECT_THROW_MSG(parse_placement(j, "t"), "'format'");
  const json load = {{"format", "moe-ep expert load v1"}, {"experts", 3}, {"window", 4}, {"steps", 4},
                     {"layers", {0}},                     {"load", {{1, 2}}}};
  EXPECT_THROW_MSG(parse_expert_load(load, "t"), "has 2 entries, expected 3");
  json load2 = load;
  load2["load"] = {{1, 2, -3}};
  EXPECT_THROW_MSG(parse_expert_load(load2, "t"), "non-negative");
  load2["load"] = {{1, 2, 3}};
  EXPECT_EQ(parse_expert_load(load2, "t").load[0][2], 3.0);
}

}  // namespace
}  // namespace moe
