// Pre-quantised checkpoints under expert parallelism (mpirun -np 1..4): every rank loads
// its own experts' int8 weights but all experts' GEMM1 smooth vectors (SmoothQuant) or
// the shared GEMM1 static scale (FastDeploy W8A8), so the dispatch sender quantises each
// token for its destination expert exactly as one rank would: with alltoall and
// alltoall-ll the output equals the single-rank layer bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/communicator.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/quant_weights.h"
#include "loader/safetensors.h"
#include "moe/ep_layer.h"
#include "../test_quant_formats_util.h"
#include "../test_quant_util.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

// Each rank writes its own copy (the writer is deterministic) and checks the layer.
void expect_ep_equals_single_rank(const std::string& fixture, int64_t layer, const test::Tensors& tensors,
                                  QuantFormat format) {
  const int R = world().size(), rank = world().rank();
  test::TempDir dir;
  test::write_checkpoint(dir.path(), fixture, tensors);
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  ASSERT_EQ(detect_quant_format(ck, cfg, layer), format);
  MoeLayer single(cfg, load_moe_layer(ck, cfg, layer, {}));
  const Placement pl = Placement::contiguous(cfg.n_experts, R, 1);
  MlpLoadOptions lo;
  lo.expert_begin = pl.begin(rank);
  lo.expert_end = pl.end(rank);
  for (int64_t T : {0, 9, 33}) {
    const Tensor x = test::seeded({T, cfg.hidden_size}, 1.f, 70 + T);
    const Tensor ref = single.forward(x);
    // Uneven token shares: rank r holds rows [T*r*(r+1)/2/tot, ...).
    std::vector<int64_t> bound(R + 1, 0);
    const int64_t tot = R * (R + 1) / 2;
    for (int i = 0, acc = 0; i < R; ++i) bound[i + 1] = T * (acc += i + 1) / tot;
    const int64_t first = bound[rank], n = bound[rank + 1] - first;
    for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllToAllLL}) {
      SCOPED_TRACE(::testing::Message() << fixture << " T=" << T << " " << moe_comm_name(c));
      EpOptions o;
      o.comm = c;
      o.max_tokens_per_rank = 40;
      EpMoeLayer ep(MoeLayer(cfg, load_moe_layer(ck, cfg, layer, lo)), world(), pl, o);
      ASSERT_TRUE(ep.local().quantized());
      const Tensor y = ep.forward(x.slice_rows(first, first + n).clone());
      ASSERT_EQ(y.dim(0), n);
      EXPECT_EQ(0, std::memcmp(y.raw(), static_cast<const float*>(ref.raw()) + first * cfg.hidden_size, y.nbytes()));
    }
  }
}

TEST(QuantFormatsEp, SmoothQuantCheckpointEqualsSingleRankBitwise) {
  expect_ep_equals_single_rank("qwen3_moe", 0, test::smoothquant_tensors("qwen3_moe", 0), QuantFormat::SmoothQuant);
}

TEST(QuantFormatsEp, StaticScaleCheckpointEqualsSingleRankBitwise) {
  expect_ep_equals_single_rank("ernie4_5_moe", 1,
                               test::static_w8a8_tensors("ernie4_5_moe", 1, test::seeded({64, 32}, 1.f, 2024)),
                               QuantFormat::StaticW8A8);
}

}  // namespace
}  // namespace moe
