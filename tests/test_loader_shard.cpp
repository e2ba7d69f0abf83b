// Sharding rules (loader/shard.h) and byte-range reads: each rank gets exactly its
// slice, and views only the bytes of it.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kernels/grouped_gemm.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/progress.h"
#include "loader/safetensors.h"
#include "loader/shard.h"
#include "moe/config.h"
#include "test_util.h"

namespace moe {
namespace {

// f32 tensor whose element i holds i (exact up to 2^24).
Tensor iota(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

// A checkpoint dir holding `tensors` (config.json is a stub).
Checkpoint make_ckpt(const test::TempDir& d, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::ofstream(d / "config.json") << "{}";
  write_safetensors(d / "model.safetensors", tensors);
  return Checkpoint::open(d.path());
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(LoaderShard, RangeIsStartEndAndUnevenIsAnErrorNamingTheTensor) {
  EXPECT_EQ(shard_range("t", 12, 0, 4), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(shard_range("t", 12, 3, 4), (std::pair<int64_t, int64_t>{9, 12}));
  expect_error([] { shard_range("model.layers.0.self_attn.q_proj.weight", 10, 0, 4); },
               {"q_proj", "10", "4 ranks"});
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"w", iota({6, 4})}});
  expect_error([&] { load_sharded(ck, "w", {6, 4}, ShardRule::column(), 0, 4); }, {"'w'", "6", "4 ranks"});
}

TEST(LoaderShard, ColumnSlicesOutputDimZeroCopyAndReadsOnlyItsBytes) {
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"w", iota({8, 4})}, {"other", iota({100})}});
  const Tensor t = load_sharded(ck, "w", {8, 4}, ShardRule::column(), 1, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 4}));
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(t.data<float>()[i], 16 + i);
  EXPECT_EQ(ck.bytes_touched(), 16u * 4);  // half of w, nothing of `other`
  // Replicated, and size 1 of any rule: the whole tensor.
  EXPECT_EQ(load_sharded(ck, "w", {8, 4}, ShardRule::replicated(), 1, 2).shape(), (Shape{8, 4}));
  EXPECT_EQ(load_sharded(ck, "w", {8, 4}, ShardRule::row(), 0, 1).shape(), (Shape{8, 4}));
  EXPECT_EQ(ck.bytes_touched(), 32u * 4);
}

TEST(LoaderShard, RowSlicesInputDimAndBiasIsAddedOnce) {
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"w", iota({3, 8})}, {"b", iota({3})}});
  const Tensor t = load_sharded(ck, "w", {3, 8}, ShardRule::row(), 1, 4);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  const float want[] = {2, 3, 10, 11, 18, 19};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<float>()[i], want[i]);
  // Row-parallel bias: rank 0 holds it, the others zeros (summed once by the all-reduce).
  const Tensor b0 = load_sharded(ck, "b", {3}, ShardRule::row_bias(), 0, 4);
  const uint64_t before = ck.bytes_touched();
  const Tensor b2 = load_sharded(ck, "b", {3}, ShardRule::row_bias(), 2, 4);
  EXPECT_EQ(ck.bytes_touched(), before);  // nothing read for a zero bias
  float sum[3] = {0, 0, 0};
  for (int r = 0; r < 4; ++r) {
    const Tensor br = load_sharded(ck, "b", {3}, ShardRule::row_bias(), r, 4);
    for (int i = 0; i < 3; ++i) sum[i] += br.data<float>()[i];
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b0.data<float>()[i], i);
    EXPECT_EQ(b2.data<float>()[i], 0.f);
    EXPECT_EQ(sum[i], i);
  }
}

TEST(LoaderShard, FusedPartsAreSlicedBlockByBlock) {
  // gate_up [2I, H] with I = 4: rank 1 of 2 holds gate rows 2..3 and up rows 6..7.
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"gu", iota({8, 3})}});
  const Tensor t = load_sharded(ck, "gu", {8, 3}, ShardRule::column(0, 2), 1, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  const float rows[] = {2, 3, 6, 7};
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(t.data<float>()[r * 3 + c], rows[r] * 3 + c);
}

TEST(LoaderShard, StackedExpertsReadOnlyTheirRowsAndSlice) {
  // [E, 2I, H] with pieces of 64 KiB (I/2 * H * 4 bytes), so each piece is its own view.
  const int64_t E = 4, I = 32, H = 1024;
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"gu", iota({E, 2 * I, H})}, {"dn", iota({E, H, I})}});
  const ShardPlan plan = plan_shard("gu", {E, 2 * I, H}, ShardRule::expert_local_stacked(1, 3, 0, 2), 1, 2);
  EXPECT_EQ(plan.out_shape, (Shape{2, I, H}));
  // 2 experts x (gate, up) pieces of I/2 rows, I rows apart: one run of 4.
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.runs[0].count, 4);
  EXPECT_EQ(plan.runs[0].len, I / 2 * H);
  EXPECT_EQ(plan.runs[0].stride, I * H);
  EXPECT_EQ(plan.runs[0].begin, (2 * I + I / 2) * H);
  const Tensor t = load_sharded(ck, "gu", {E, 2 * I, H}, ShardRule::expert_local_stacked(1, 3, 0, 2), 1, 2);
  EXPECT_EQ(t.shape(), (Shape{2, I, H}));
  // local expert 1 = global 2; its row 0 is gate row I/2, row I/2 is up row I + I/2.
  auto at = [&](int64_t e, int64_t r, int64_t c) { return t.data<float>()[(e * I + r) * H + c]; };
  EXPECT_EQ(at(1, 0, 5), static_cast<float>((2 * 2 * I + I / 2) * H + 5));
  EXPECT_EQ(at(1, I / 2, 0), static_cast<float>((2 * 2 * I + I + I / 2) * H));
  EXPECT_EQ(ck.bytes_touched(), static_cast<uint64_t>(2 * I * H * 4));  // a quarter of gu
  // Without TP, the experts' rows are one range: a zero-copy view.
  const Tensor all = load_sharded(ck, "gu", {E, 2 * I, H}, ShardRule::expert_local_stacked(2, 4, 0, 2), 0, 1);
  EXPECT_EQ(all.shape(), (Shape{2, 2 * I, H}));
  EXPECT_EQ(all.data<float>()[0], static_cast<float>(2 * 2 * I * H));
  // Down [E, H, I] sliced on I (MoE-TP): a small strided piece per row, and only those
  // bytes are read: half of expert 3's down_proj.
  const uint64_t before = ck.bytes_touched();
  const Tensor dn = load_sharded(ck, "dn", {E, H, I}, ShardRule::expert_local_stacked(3, 4, 1), 0, 2);
  EXPECT_EQ(dn.shape(), (Shape{1, H, I / 2}));
  EXPECT_EQ(dn.data<float>()[I / 2], static_cast<float>(3 * H * I + I));  // row 1, col 0
  EXPECT_EQ(ck.bytes_touched() - before, static_cast<uint64_t>(H * I / 2 * 4));
}

TEST(LoaderShard, StridedReadsCountTheUnionOfWhatEachRankTouches) {
  // o_proj-like [H, nq] row-parallel over 4: each rank reads a column block of every
  // row, and a rank's bytes are exactly its quarter.
  const int64_t H = 64, nq = 32;
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"o", iota({H, nq})}, {"x", iota({16})}});
  const uint64_t full = H * nq * 4;
  const Tensor t1 = load_sharded(ck, "o", {H, nq}, ShardRule::row(), 1, 4);
  EXPECT_EQ(t1.shape(), (Shape{H, nq / 4}));
  EXPECT_EQ(t1.data<float>()[nq / 4 + 2], static_cast<float>(nq + nq / 4 + 2));  // row 1, col 2 of the block
  EXPECT_EQ(ck.bytes_touched(), full / 4);
  load_sharded(ck, "o", {H, nq}, ShardRule::row(), 1, 4);  // the same slice again: nothing new
  EXPECT_EQ(ck.bytes_touched(), full / 4);
  load_sharded(ck, "o", {H, nq}, ShardRule::row(), 3, 4);  // another rank's: disjoint pieces
  EXPECT_EQ(ck.bytes_touched(), full / 2);
  ck.view_elems("o", nq / 4, {nq / 2});  // row 0 cols [8, 24): half of it was rank 1's
  EXPECT_EQ(ck.bytes_touched(), full / 2 + nq / 4 * 4);
  ck.view("o");  // the whole tensor: counted once
  EXPECT_EQ(ck.bytes_touched(), full);
  ck.view("x");
  EXPECT_EQ(ck.bytes_touched(), full + 16 * 4);
  // Pieces outside the tensor are an error naming it.
  std::vector<float> buf(64);
  expect_error([&] { ck.copy_strided("o", 0, 8, nq, H + 1, buf.data()); }, {"'o'", "outside"});
}

TEST(LoaderShard, WhitelistReplicatesAndDTypeConverts) {
  const ShardRule r = apply_whitelist("model.layers.1.mlp.shared_experts.down_proj.weight", ShardRule::row(),
                                      {"shared_experts"});
  EXPECT_EQ(r.kind, ShardKind::Replicated);
  EXPECT_EQ(apply_whitelist("model.layers.1.mlp.down_proj.weight", ShardRule::row(), {"shared_experts"}).kind,
            ShardKind::Row);
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"w", iota({4, 4}).to(DType::BF16)}});
  const Tensor t = load_sharded(ck, "w", {4, 4}, ShardRule::column(), 1, 2, DType::F32);
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(t.data<float>()[0], 8.f);
  expect_error([&] { load_sharded(ck, "w", {4, 5}, ShardRule::column(), 0, 2); },
               {"'w'", "[4, 4]", "[4, 5]", "model.safetensors"});
  expect_error([&] { load_sharded(ck, "nope", {4}, ShardRule::column(), 0, 2); }, {"nope", "missing"});
}

TEST(LoaderShard, ViewElemsRejectsOutOfRangeAndCountsUnion) {
  test::TempDir d;
  Checkpoint ck = make_ckpt(d, {{"w", iota({10})}});
  ck.view_elems("w", 2, {4});
  ck.view_elems("w", 4, {4});  // overlaps [4, 6): counted once
  EXPECT_EQ(ck.bytes_touched(), 6u * 4);
  ck.view("w");
  EXPECT_EQ(ck.bytes_touched(), 10u * 4);
  expect_error([&] { ck.view_elems("w", 8, {4}); }, {"'w'", "outside"});
  expect_error([&] { ck.view_elems("w", -1, {1}); }, {"'w'"});
  expect_error([&] { ck.view_rows("w", 3, 11); }, {"'w'", "rows [3, 11)"});
}

// Loading rank shares of a fixture touches only their experts, for both layouts, and
// gives the same packed weights as slicing the single-rank load.
TEST(LoaderShard, MoeLayerSharesMatchTheFullLoadAndReadOnlyTheirExperts) {
  for (const char* name : {"mixtral", "mixtral_fused", "qwen2_moe", "qwen2_moe_fused"}) {
    SCOPED_TRACE(name);
    const std::string dir = test::fixtures_dir() + "/" + name;
    Checkpoint full_ck = Checkpoint::open(dir);
    const MoeConfig cfg = MoeConfig::from_hf(full_ck.config());
    const int64_t E = cfg.n_experts, I = cfg.moe_intermediate_size;
    const MoeLayerWeights full = load_moe_layer(full_ck, cfg, 0, {});
    for (int tp : {1, 2}) {
      const int64_t b = E / 2, e = E;
      for (int tr = 0; tr < tp; ++tr) {
        Checkpoint ck = Checkpoint::open(dir);
        MlpLoadOptions o;
        o.expert_begin = b;
        o.expert_end = e;
        o.tp_rank = tr;
        o.tp_size = tp;
        const MoeLayerWeights w = load_moe_layer(ck, cfg, 0, o);
        EXPECT_EQ(ck.bytes_touched(), mlp_layer_read_bytes(ck, cfg, 0, o));
        const int64_t Il = I / tp;
        // Exactly this rank's slice of its experts (gate, up and down: 3 x [Il, H])
        // plus the replicated router and shared experts: nothing of the other slice.
        uint64_t replicated = 0;
        for (const LayerRead& r : mlp_layer_reads(ck, cfg, 0, o))
          if (r.role == LayerRead::Router || r.role == LayerRead::Bias || r.role == LayerRead::Shared ||
              r.role == LayerRead::SharedGate)
            replicated += ck.info(r.key).nbytes;
        const uint64_t es = dtype_size(ck.info(mlp_keys(cfg, 0, &ck).router).dtype);
        EXPECT_EQ(ck.bytes_touched(), replicated + static_cast<uint64_t>((e - b) * 3 * Il * cfg.hidden_size) * es);
        for (int64_t le = 0; le < e - b; ++le) {
          const Tensor got13 = unpack_expert(w.w13, le), ref13 = unpack_expert(full.w13, b + le);
          const Tensor got2 = unpack_expert(w.w2, le), ref2 = unpack_expert(full.w2, b + le);
          const int64_t H = cfg.hidden_size;
          for (int64_t r = 0; r < 2 * Il; ++r) {
            const int64_t src = r < Il ? tr * Il + r : I + tr * Il + (r - Il);
            ASSERT_EQ(0, std::memcmp(got13.data<float>() + r * H, ref13.data<float>() + src * H, H * 4));
          }
          for (int64_t h = 0; h < H; ++h)
            ASSERT_EQ(0, std::memcmp(got2.data<float>() + h * Il, ref2.data<float>() + h * I + tr * Il, Il * 4));
        }
      }
    }
  }
}

TEST(LoaderShard, ProgressPrintsAPlainLinePerTenPercent) {
  testing::internal::CaptureStderr();
  {
    Progress p("loading", 1000, true, /*min_bytes=*/1);
    p.set_terminal(false);
    for (int i = 0; i < 20; ++i) p.advance(50);
  }
  const std::string out = testing::internal::GetCapturedStderr();
  int lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 11) << out;  // one per 10 %, then the summary
  EXPECT_NE(out.find("loading: 10%"), std::string::npos) << out;
  EXPECT_NE(out.find("loading: 100%"), std::string::npos) << out;
  EXPECT_NE(out.find("loading: done, 0.00 GB in "), std::string::npos) << out;
  EXPECT_NE(out.find(" GB/s)\n"), std::string::npos) << out;
  testing::internal::CaptureStderr();
  {
    Progress p("small", 1000);  // under the default threshold: silent
    p.advance(1000);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace moe
