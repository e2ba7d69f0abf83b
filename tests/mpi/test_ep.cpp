// Expert parallelism across real ranks (this binary runs under mpirun -np 1..4).
//
// 1. Rank-tagged payloads (DeepEP style): each token carries its global index and
//    the experts are built so that their output encodes (token, expert) exactly;
//    every strategy must return exactly what the routing says, to the right place.
// 2. Every fixture of every family through every strategy against the single-rank
//    layer: alltoall and alltoall-ll bitwise equal (tp = 1), allreduce/allgather and
//    MoE-TP within fp32 summation-order rounding (1e-5 abs + 1e-5 rel).
// Uneven token counts with ranks holding 0 tokens, E not divisible by ep, k = 1..8,
// T = 0 and chunked runs are all covered.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

#include "cli/parallel_opts.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/ep_layer.h"
#include "fixture_cases.h"

namespace moe {
namespace {

constexpr MoeComm kAll[] = {MoeComm::AllReduce, MoeComm::AllGather, MoeComm::AllToAll, MoeComm::AllToAllLL};

Communicator& world() { return world_comm(true); }

// Valid (ep, tp) layouts for this world size.
std::vector<std::pair<int, int>> layouts() {
  std::vector<std::pair<int, int>> out;
  const int R = world().size();
  for (int tp = 1; tp <= R; ++tp)
    if (R % tp == 0) out.push_back({R / tp, tp});
  return out;
}

// This rank's rows of a T-row input: all of them for allreduce, else an uneven split
// where some ranks (rank 1 when R > 1) get none.
std::pair<int64_t, int64_t> my_share(int64_t T, MoeComm c) {
  const int R = world().size(), r = world().rank();
  if (c == MoeComm::AllReduce) return {0, T};
  std::vector<int64_t> w(R);
  for (int i = 0; i < R; ++i) w[i] = (R > 1 && i == 1) ? 0 : i + 1;
  int64_t tot = 0;
  for (int64_t v : w) tot += v;
  int64_t first = 0, acc = 0;
  std::vector<int64_t> b(R + 1, 0);
  for (int i = 0; i < R; ++i) {
    acc += w[i];
    b[i + 1] = T * acc / tot;
  }
  (void)first;
  return {b[r], b[r + 1] - b[r]};
}

// --- 1. Rank-tagged payloads ------------------------------------------------------

// Experts whose output is exact: x = [1, tag, 0, ...]; gate rows give 128 (silu(128)
// is exactly 128 in f32), up rows give (tag, 1), so h = (128 tag, 128); down gives
// out = [tag, e + 1, 0, ...]. All values are small integers: exact in bf16 too.
MoeLayerWeights tagged_weights(const MoeConfig& cfg, int64_t begin, int64_t end, DType dt, uint64_t seed) {
  const int64_t H = cfg.hidden_size, E = cfg.n_experts;
  MoeLayerWeights w;
  w.expert_begin = begin;
  w.expert_end = end;
  w.gate = make_packed_experts(1, E, H, DType::F32, false);
  Tensor g = Tensor::zeros({E, H}, DType::F32);
  uint64_t s = seed;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < 2; ++h) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      g.data<float>()[e * H + h] = static_cast<float>((s >> 40) % 1000) / 250.f - 2.f;
    }
  pack_expert(w.gate, 0, g);
  w.w13 = make_packed_experts(end - begin, 4, H, dt, true);
  w.w2 = make_packed_experts(end - begin, H, 2, dt, false);
  for (int64_t e = begin; e < end; ++e) {
    Tensor w13 = Tensor::zeros({4, H}, DType::F32);
    w13.data<float>()[0 * H + 0] = 128.f;  // gate 0 = 128 * x0
    w13.data<float>()[1 * H + 0] = 128.f;  // gate 1 = 128 * x0
    w13.data<float>()[2 * H + 1] = 1.f;    // up 0 = tag
    w13.data<float>()[3 * H + 0] = 1.f;    // up 1 = 1
    Tensor w2 = Tensor::zeros({H, 2}, DType::F32);
    w2.data<float>()[0 * 2 + 0] = 1.f / 128.f;                   // out0 = tag
    w2.data<float>()[1 * 2 + 1] = static_cast<float>(e + 1) / 128.f;  // out1 = e + 1
    pack_expert(w.w13, e - begin, w13);
    pack_expert(w.w2, e - begin, w2);
  }
  return w;
}

MoeConfig tagged_config(int64_t E, int64_t k) {
  MoeConfig c;
  c.model_type = "tagged";
  c.n_layers = 1;
  c.hidden_size = 8;
  c.moe_intermediate_size = 2;
  c.n_experts = E;
  c.top_k = k;
  c.routing.renormalize = true;
  return c;
}

TEST(EpTagged, EverySlotReachesItsExpertAndComesBack) {
  const int R = world().size(), rank = world().rank();
  for (auto [ep, tp] : layouts()) {
    if (tp > 1) continue;  // the tag experts have I = 2; MoE-TP is covered by the fixtures
    for (auto [E, k] : std::vector<std::pair<int64_t, int64_t>>{{7, 1}, {8, 2}, {13, 8}, {5, 5}}) {
      if (E < ep) continue;
      const MoeConfig cfg = tagged_config(E, k);
      const Placement pl = Placement::contiguous(E, ep, tp);
      for (MoeComm c : kAll)
        for (DType dt : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(::testing::Message() << "R=" << R << " E=" << E << " k=" << k << " " << moe_comm_name(c) << " "
                                            << dtype_name(dt));
          const int64_t T = 37;
          auto [first, n] = my_share(T, c);
          Tensor x = Tensor::zeros({n, 8}, DType::F32);
          for (int64_t t = 0; t < n; ++t) {
            x.data<float>()[t * 8 + 0] = 1.f;
            x.data<float>()[t * 8 + 1] = static_cast<float>(first + t);
          }
          EpOptions o;
          o.comm = c;
          o.max_tokens_per_rank = 64;
          EpMoeLayer layer(MoeLayer(cfg, tagged_weights(cfg, pl.begin(rank / tp), pl.end(rank / tp), dt, 7)), world(),
                           pl, o);
          const Tensor y = layer.forward(x);
          // Expected: the same routing on the same token (computed locally: the gate is
          // replicated), summed in slot order with the same float operations.
          Routing r;
          layer.local().route(x, r);
          for (int64_t t = 0; t < n; ++t) {
            float y0 = 0.f, y1 = 0.f;
            for (int64_t j = 0; j < k; ++j) {
              y0 += r.weights[t * k + j] * static_cast<float>(first + t);
              y1 += r.weights[t * k + j] * static_cast<float>(r.ids[t * k + j] + 1);
            }
            if (c == MoeComm::AllToAll || c == MoeComm::AllToAllLL) {
              // Summed at the source in slot order: the same float operations as here.
              ASSERT_EQ(y.data<float>()[t * 8 + 0], y0) << "token " << first + t << " came back with another token's row";
              ASSERT_EQ(y.data<float>()[t * 8 + 1], y1) << "token " << first + t << " reached the wrong experts";
            } else {
              // Partial sums of different ranks are added in another order: f32 rounding.
              // A misrouted slot would be off by at least min weight * 1 (expert ids differ by 1).
              ASSERT_NEAR(y.data<float>()[t * 8 + 0], y0, 1e-5 * std::fabs(y0)) << "token " << first + t;
              ASSERT_NEAR(y.data<float>()[t * 8 + 1], y1, 1e-5 * std::fabs(y1)) << "token " << first + t;
            }
            for (int64_t h = 2; h < 8; ++h) ASSERT_EQ(y.data<float>()[t * 8 + h], 0.f);
          }
        }
    }
  }
}

// --- 2. Fixtures against the single-rank layer -------------------------------------

using test::moe_cases;
using Case = test::MoeCase;
const std::vector<int64_t> kTokens = {0, 7, 33};  // T=1 adds nothing the others do not cover here

class EpFixtures : public ::testing::TestWithParam<DType> {};

TEST_P(EpFixtures, EveryStrategyMatchesSingleRank) {
  const DType dt = GetParam();
  const int rank = world().rank();
  int checked = 0;
  for (const Case& cs : moe_cases(kTokens)) {
    Checkpoint ck = Checkpoint::open(cs.dir);
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    const Tensor x = SafetensorsFile::open(cs.input)->view("hidden_states").clone();
    const int64_t T = x.dim(0), H = cfg.hidden_size;
    MlpLoadOptions full;
    full.compute = dt;
    MoeLayer single(cfg, load_moe_layer(ck, cfg, cs.layer, full));
    const Tensor ref = single.forward(x);
    for (auto [ep, tp] : layouts()) {
      if (cfg.n_experts < ep || cfg.moe_intermediate_size % tp != 0) continue;
      const Placement pl = Placement::contiguous(cfg.n_experts, ep, tp);
      MlpLoadOptions lo;
      lo.compute = dt;
      lo.expert_begin = pl.begin(rank / tp);
      lo.expert_end = pl.end(rank / tp);
      lo.tp_rank = rank % tp;
      lo.tp_size = tp;
      for (MoeComm c : kAll)
        for (int64_t chunk : {int64_t{0}, int64_t{3}}) {
          SCOPED_TRACE(::testing::Message() << cs.dir << " layer " << cs.layer << " T=" << T << " ep=" << ep << " tp="
                                            << tp << " " << moe_comm_name(c) << " chunk=" << chunk);
          EpOptions o;
          o.comm = c;
          o.chunk_tokens = chunk;
          o.max_tokens_per_rank = 40;
          EpMoeLayer layer(MoeLayer(cfg, load_moe_layer(ck, cfg, cs.layer, lo)), world(), pl, o);
          auto [first, n] = my_share(T, c);
          const Tensor y = layer.forward(x.slice_rows(first, first + n).clone());
          ASSERT_EQ(y.dim(0), n);
          const bool bitwise = (c == MoeComm::AllToAll || c == MoeComm::AllToAllLL) && tp == 1;
          for (int64_t i = 0; i < n * H; ++i) {
            const float got = y.data<float>()[i], want = ref.data<float>()[first * H + i];
            if (bitwise)
              ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "element " << i << ": " << got << " vs " << want;
            else
              ASSERT_NEAR(got, want, 1e-5 + 1e-5 * std::fabs(want)) << "element " << i;
          }
          ++checked;
        }
    }
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EpFixtures, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(EpReplicated, SameTokensOnEveryRankGiveTheSingleRankOutput) {
  const int rank = world().rank();
  int checked = 0;
  for (const Case& cs : moe_cases(kTokens)) {
    if (cs.input.find("T33") == std::string::npos) continue;
    Checkpoint ck = Checkpoint::open(cs.dir);
    const MoeConfig cfg = MoeConfig::from_hf(ck.config());
    const Tensor x = SafetensorsFile::open(cs.input)->view("hidden_states").clone();
    MoeLayer single(cfg, load_moe_layer(ck, cfg, cs.layer, {}));
    const Tensor ref = single.forward(x);
    const int ep = world().size();
    if (cfg.n_experts < ep) continue;
    const Placement pl = Placement::contiguous(cfg.n_experts, ep, 1);
    MlpLoadOptions lo;
    lo.expert_begin = pl.begin(rank);
    lo.expert_end = pl.end(rank);
    for (MoeComm c : kAll) {
      SCOPED_TRACE(::testing::Message() << cs.dir << " layer " << cs.layer << " " << moe_comm_name(c));
      EpOptions o;
      o.comm = c;
      EpMoeLayer layer(MoeLayer(cfg, load_moe_layer(ck, cfg, cs.layer, lo)), world(), pl, o);
      const Tensor y = layer.forward_replicated(x);
      ASSERT_EQ(y.shape(), ref.shape());
      if (c == MoeComm::AllToAll || c == MoeComm::AllToAllLL) {
        ASSERT_EQ(0, std::memcmp(y.raw(), ref.raw(), ref.nbytes()));
      } else {
        for (int64_t i = 0; i < ref.numel(); ++i)
          ASSERT_NEAR(y.data<float>()[i], ref.data<float>()[i], 1e-5 + 1e-5 * std::fabs(ref.data<float>()[i]));
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(EpErrors, AllToAllLLOverflowIsAnErrorOnEveryRank) {
  const int R = world().size(), rank = world().rank();
  const MoeConfig cfg = tagged_config(8, 2);
  const Placement pl = Placement::contiguous(8, R, 1);
  EpOptions o;
  o.comm = MoeComm::AllToAllLL;
  o.max_tokens_per_rank = 4;
  EpMoeLayer layer(MoeLayer(cfg, tagged_weights(cfg, pl.begin(rank), pl.end(rank), DType::F32, 1)), world(), pl, o);
  // Only the last rank overflows; every rank must throw (and none may hang).
  const int64_t n = rank == R - 1 ? 5 : 1;
  Tensor x = Tensor::zeros({n, 8}, DType::F32);
  try {
    layer.forward(x);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-tokens-per-rank 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(R - 1)), std::string::npos) << e.what();
  }
  // Auto falls back to the normal all-to-all instead.
  o.comm = MoeComm::Auto;
  EpMoeLayer autol(MoeLayer(cfg, tagged_weights(cfg, pl.begin(rank), pl.end(rank), DType::F32, 1)), world(), pl, o);
  autol.forward(x);
  EXPECT_EQ(autol.stats().used, MoeComm::AllToAll);
  Tensor small = Tensor::zeros({1, 8}, DType::F32);
  autol.forward(small);
  EXPECT_EQ(autol.stats().used, MoeComm::AllToAllLL);
}

TEST(EpErrors, AllReduceWithDifferentTokensIsAnError) {
  const int R = world().size(), rank = world().rank();
  if (R == 1) GTEST_SKIP() << "needs two ranks";
  const MoeConfig cfg = tagged_config(8, 2);
  const Placement pl = Placement::contiguous(8, R, 1);
  EpOptions o;
  o.comm = MoeComm::AllReduce;
  EpMoeLayer layer(MoeLayer(cfg, tagged_weights(cfg, pl.begin(rank), pl.end(rank), DType::F32, 1)), world(), pl, o);
  Tensor x = Tensor::zeros({rank + 1, 8}, DType::F32);
  EXPECT_THROW(layer.forward(x), Error);
}

TEST(TokenShares, LayoutsAreContiguousAndComplete) {
  for (int R : {1, 2, 3, 4})
    for (int dp : {1, 2, 4})
      if (R % dp == 0)
        for (int64_t T : {0, 1, 7, 33}) {
          const auto s = token_shares(T, R, dp, false, {});
          int64_t next = 0;
          for (const auto& [b, n] : s) {
            ASSERT_EQ(b, next);
            next += n;
          }
          ASSERT_EQ(next, T);
        }
  const auto u = token_shares(8, 4, 4, false, {3, 0, 5, 0});
  EXPECT_EQ(u[0], (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(u[1], (std::pair<int64_t, int64_t>{3, 0}));
  EXPECT_EQ(u[2], (std::pair<int64_t, int64_t>{3, 5}));
  EXPECT_THROW(token_shares(8, 4, 4, false, {3, 0, 4, 0}), Error);
  EXPECT_THROW(token_shares(8, 4, 2, false, {3, 0, 5}), Error);
}

}  // namespace
}  // namespace moe
