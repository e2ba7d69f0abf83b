// W8A8 under expert parallelism (this binary runs under mpirun -np 1..4): with alltoall
// and alltoall-ll the tokens travel as Q8 rows (int8 + an f32 scale tail), quantised by
// the sender exactly as the single-rank expand quantises them, so the output equals the
// single-rank W8A8 layer bit for bit, with one smooth vector for all experts (one record
// per token and destination rank) and with per-expert smooth vectors (one record per
// slot). allgather (f32 rows, quantised by the owner) and allreduce match to fp32
// summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/communicator.h"
#include "moe/ep_layer.h"
#include "../test_quant_util.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

// Uneven shares; rank 1 holds none when R > 1.
std::pair<int64_t, int64_t> share(int64_t T, MoeComm c) {
  const int R = world().size(), r = world().rank();
  if (c == MoeComm::AllReduce) return {0, T};
  std::vector<int64_t> w(R), b(R + 1, 0);
  int64_t tot = 0;
  for (int i = 0; i < R; ++i) tot += (w[i] = (R > 1 && i == 1) ? 0 : i + 1);
  int64_t acc = 0;
  for (int i = 0; i < R; ++i) b[i + 1] = T * (acc += w[i]) / tot;
  return {b[r], b[r + 1] - b[r]};
}

TEST(QuantEp, Int8DispatchEqualsSingleRankBitwise) {
  const int R = world().size(), rank = world().rank();
  int checked = 0;
  for (bool smooth : {false, true})
    for (int64_t k : {1, 3}) {
      const MoeConfig cfg = test::w8a8_config(72, 40, 7, k, smooth ? 24 : 0);
      MoeLayer single(cfg, test::w8a8_layer(cfg, 0, 7, smooth));
      const Placement pl = Placement::contiguous(7, R, 1);
      for (DType xd : {DType::F32, DType::BF16})
        for (int64_t T : {0, 5, 29}) {
          const Tensor x = test::seeded({T, 72}, 1.f, 900 + T).to(xd);
          const Tensor ref = single.forward(x);
          for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllToAllLL, MoeComm::AllGather, MoeComm::AllReduce})
            for (int64_t chunk : {int64_t{0}, int64_t{4}}) {
              SCOPED_TRACE(::testing::Message() << "smooth " << smooth << " k=" << k << " x " << dtype_name(xd)
                                                << " T=" << T << " " << moe_comm_name(c) << " chunk " << chunk);
              EpOptions o;
              o.comm = c;
              o.chunk_tokens = chunk;
              o.max_tokens_per_rank = 32;
              EpMoeLayer ep(MoeLayer(cfg, test::w8a8_layer(cfg, pl.begin(rank), pl.end(rank), smooth)), world(), pl,
                            o);
              ASSERT_TRUE(ep.local().quantized());
              auto [first, n] = share(T, c);
              const Tensor y = ep.forward(x.slice_rows(first, first + n).clone());
              ASSERT_EQ(y.dim(0), n);
              const bool bitwise = c == MoeComm::AllToAll || c == MoeComm::AllToAllLL;
              for (int64_t i = 0; i < n * 72; ++i) {
                const float got = y.data<float>()[i], want = ref.data<float>()[first * 72 + i];
                if (bitwise)
                  ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "element " << i << ": " << got << " vs " << want;
                else
                  ASSERT_NEAR(got, want, 1e-5 + 1e-5 * std::fabs(want)) << "element " << i;
              }
              ++checked;
            }
        }
    }
  EXPECT_EQ(checked, 2 * 2 * 2 * 3 * 4 * 2);
}

// Dispatch bytes: a Q8 row is H + 4 bytes against 2H for bf16, so with the same routing
// the alltoall dispatch of W8A8 sends about half the bytes of bf16 (combine stays f32).
TEST(QuantEp, Int8DispatchHalvesTheBytes) {
  const int R = world().size(), rank = world().rank();
  if (R == 1) GTEST_SKIP() << "needs two ranks";
  const MoeConfig cfg = test::w8a8_config(256, 64, 8, 2);
  const Placement pl = Placement::contiguous(8, R, 1);
  const Tensor x = test::seeded({16, 256}, 1.f, 5 + rank);
  MoeLayerWeights q = test::w8a8_layer(cfg, pl.begin(rank), pl.end(rank), false);
  // The same router, bf16 experts (their values do not matter for the bytes).
  MoeLayerWeights b;
  b.expert_begin = q.expert_begin;
  b.expert_end = q.expert_end;
  b.gate = q.gate;
  b.w13 = make_packed_experts(q.n_local(), 2 * 64, 256, DType::BF16, true);
  b.w2 = make_packed_experts(q.n_local(), 256, 64, DType::BF16, false);
  for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllToAllLL}) {
    EpOptions o;
    o.comm = c;
    EpMoeLayer eq(MoeLayer(cfg, q), world(), pl, o), eb(MoeLayer(cfg, b), world(), pl, o);
    eq.forward(x);
    const double dq = eq.stats().dispatch_bytes;
    eb.forward(x);
    const double db = eb.stats().dispatch_bytes;
    // Per token record: k ids (alltoall) or an 8-byte head (alltoall-ll) + the row:
    // H + 4 bytes (Q8) vs 2H (bf16): a ratio of (8 + 260) / (8 + 512) here.
    EXPECT_GT(db, 0);
    EXPECT_NEAR(dq / db, (8.0 + 260.0) / (8.0 + 512.0), 1e-3) << moe_comm_name(c);
    if (rank == 0)
      std::printf("[ w8a8 ep  ] %s: dispatch bytes sent by rank 0: w8a8 %.0f vs bf16 %.0f (x%.3f)\n",
                  moe_comm_name(c), dq, db, dq / db);
  }
}

}  // namespace
}  // namespace moe
