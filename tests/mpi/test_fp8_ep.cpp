// FP8 weight-only experts under expert parallelism (this binary runs under mpirun -np
// 1..4): tokens travel as bf16 rows (the compute dtype of e4m3 weights) and each rank
// dequantises only its own experts' panels, so alltoall / alltoall-ll equal the single
// rank layer bit for bit; allgather and allreduce to fp32 summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "comm/communicator.h"
#include "moe/ep_layer.h"
#include "../test_quant_util.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

constexpr int64_t kH = 64, kI = 32, kE = 7, kBn = 16, kBk = 32;

// Expert e's e4m3 codes (no NaN codes) and block scales, from its own seed on every rank.
void pack_fp8_expert(PackedExperts& p, int64_t slot, int64_t e, int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed + 97 * e);
  Tensor w = Tensor::empty({n, k}, DType::F8E4M3);
  auto* c = static_cast<uint8_t*>(w.raw());
  for (int64_t i = 0; i < n * k; ++i) {
    const uint64_t b = rng();
    c[i] = static_cast<uint8_t>((b & 0x80) | (((b >> 8) % 9) << 3) | ((b >> 16) & 7));  // exponents 0..8
  }
  Tensor s = Tensor::empty({n / kBn, k / kBk}, DType::F32);
  for (int64_t i = 0; i < s.numel(); ++i) s.data<float>()[i] = (0.02f + 0.01f * (rng() % 7)) / std::sqrt(float(k));
  pack_expert_fp8(p, slot, w, s, kBn);
}

MoeLayerWeights fp8_layer(const MoeConfig& cfg, int64_t begin, int64_t end) {
  MoeLayerWeights w;
  w.expert_begin = begin;
  w.expert_end = end;
  w.gate = make_packed_experts(1, kE, kH, DType::F32, false);
  pack_expert(w.gate, 0, test::seeded({kE, kH}, 2.f / std::sqrt(float(kH)), 1));
  w.w13 = make_packed_experts_fp8(end - begin, 2 * kI, kH, true, kBk);
  w.w2 = make_packed_experts_fp8(end - begin, kH, kI, false, kBk);
  for (int64_t e = begin; e < end; ++e) {
    pack_fp8_expert(w.w13, e - begin, e, 2 * kI, kH, 11);
    pack_fp8_expert(w.w2, e - begin, e, kH, kI, 13);
  }
  (void)cfg;
  return w;
}

TEST(Fp8Ep, AllToAllEqualsSingleRankBitwise) {
  const int R = world().size(), rank = world().rank();
  const MoeConfig cfg = test::w8a8_config(kH, kI, kE, 2);
  MoeLayer single(cfg, fp8_layer(cfg, 0, kE));
  ASSERT_EQ(single.compute_dtype(), DType::BF16);
  const Placement pl = Placement::contiguous(kE, R, 1);
  int checked = 0;
  for (int64_t T : {0, 6, 31}) {
    const Tensor x = test::seeded({T, kH}, 1.f, 700 + T);
    const Tensor ref = single.forward(x);
    for (MoeComm c : {MoeComm::AllToAll, MoeComm::AllToAllLL, MoeComm::AllGather, MoeComm::AllReduce}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " " << moe_comm_name(c));
      EpOptions o;
      o.comm = c;
      o.max_tokens_per_rank = 32;
      EpMoeLayer ep(MoeLayer(cfg, fp8_layer(cfg, pl.begin(rank), pl.end(rank))), world(), pl, o);
      // Every rank feeds the same tokens for allreduce; the others split them evenly.
      const int64_t first = c == MoeComm::AllReduce ? 0 : T * rank / R;
      const int64_t n = c == MoeComm::AllReduce ? T : T * (rank + 1) / R - first;
      const Tensor y = ep.forward(x.slice_rows(first, first + n).clone());
      ASSERT_EQ(y.dim(0), n);
      const bool bitwise = c == MoeComm::AllToAll || c == MoeComm::AllToAllLL;
      for (int64_t i = 0; i < n * kH; ++i) {
        const float got = y.data<float>()[i], want = ref.data<float>()[first * kH + i];
        if (bitwise)
          ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "element " << i << ": " << got << " vs " << want;
        else
          ASSERT_NEAR(got, want, 1e-5 + 1e-5 * std::fabs(want)) << "element " << i;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * 4);
}

}  // namespace
}  // namespace moe
