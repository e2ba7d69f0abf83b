// gen_idx / expand / combine: permutation, counts, expert-range slices, T = 0.
#include <gtest/gtest.h>

#include <random>

#include "kernels/permute.h"
#include "test_util.h"

namespace moe {
namespace {

std::vector<int32_t> random_ids(int64_t T, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(T * k);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), k, ids.begin() + t * k);
  }
  return ids;
}

TEST(Permute, GenIdxIsAStableInvertibleSortByExpert) {
  for (auto [T, k, E] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 2, 8}, {1, 1, 1}, {1, 8, 128},
                                                                            {37, 3, 12}, {300, 8, 60}}) {
    const auto ids = random_ids(T, k, E, T * 31 + E);
    RouteIndex idx;
    gen_idx(ids.data(), T, k, E, idx);
    ASSERT_EQ(idx.offsets.front(), 0);
    ASSERT_EQ(idx.offsets.back(), T * k);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t want = std::count(ids.begin(), ids.end(), static_cast<int32_t>(e));
      ASSERT_EQ(idx.counts[e], want);
      ASSERT_EQ(idx.offsets[e + 1] - idx.offsets[e], want);
      for (int64_t p = idx.offsets[e]; p < idx.offsets[e + 1]; ++p) {
        ASSERT_EQ(ids[idx.sorted_slot[p]], e) << "position " << p << " is not expert " << e;
        if (p > idx.offsets[e]) {
          ASSERT_LT(idx.sorted_slot[p - 1], idx.sorted_slot[p]) << "not stable";
        }
      }
    }
    for (int64_t s = 0; s < T * k; ++s) {
      ASSERT_EQ(idx.sorted_slot[idx.combine_idx[s]], s);
      ASSERT_EQ(idx.gather_idx[idx.combine_idx[s]], s / k);
    }
  }
}

TEST(Permute, GenIdxRejectsOutOfRangeIds) {
  RouteIndex idx;
  const std::vector<int32_t> bad = {0, 8};
  EXPECT_THROW(gen_idx(bad.data(), 1, 2, 8, idx), Error);
  const std::vector<int32_t> neg = {-1};
  EXPECT_THROW(gen_idx(neg.data(), 1, 1, 8, idx), Error);
}

TEST(Permute, ExpandRangeAndCombineMatchBruteForce) {
  const int64_t T = 29, k = 3, E = 10, H = 17;
  const auto ids = random_ids(T, k, E, 5);
  const Tensor x = test::random_bf16_exact({T, H}, 1.f, 6);
  const Tensor w = test::random_f32({T, k}, 1.f, 7);
  RouteIndex idx;
  gen_idx(ids.data(), T, k, E, idx);
  // Split the experts into ranges as ranks would; each range expands only its rows.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 3}, {3, 4}, {4, 4}, {4, 10}};
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  for (auto [b, e] : ranges) {
    for (DType dt : {DType::F32, DType::BF16}) {
      const int64_t rows = idx.rows_in(b, e);
      Tensor rows_t = Tensor::empty({rows, H}, dt);
      ExpandParams ep;
      ep.x = x.raw();
      ep.x_dtype = DType::F32;
      ep.hidden = H;
      ep.ldx = H;
      ep.index = &idx;
      ep.expert_begin = b;
      ep.expert_end = e;
      ep.out = rows_t.raw();
      ep.out_dtype = dt;
      expand(ep);
      const Tensor rf = rows_t.to(DType::F32);
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t slot = idx.sorted_slot[idx.offsets[b] + r];
        ASSERT_GE(ids[slot], b);
        ASSERT_LT(ids[slot], e);
        for (int64_t h = 0; h < H; ++h)
          ASSERT_EQ(rf.data<float>()[r * H + h], x.data<float>()[(slot / k) * H + h]);
      }
      if (dt == DType::BF16) continue;
      // "Expert output" = the row scaled by (expert id + 1), so the combine is checkable.
      Tensor out = rf.clone();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < H; ++h) out.data<float>()[r * H + h] *= ids[idx.sorted_slot[idx.offsets[b] + r]] + 1;
      CombineParams cp;
      cp.expert_out = out.data<float>();
      cp.pos_base = idx.offsets[b];
      cp.expert_begin = b;
      cp.expert_end = e;
      cp.ids = ids.data();
      cp.weights = w.data<float>();
      cp.index = &idx;
      cp.hidden = H;
      cp.y = y.data<float>();
      cp.accumulate = true;
      combine(cp);
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double want = 0;
      for (int64_t j = 0; j < k; ++j) want += w.data<float>()[t * k + j] * x.data<float>()[t * H + h] * (ids[t * k + j] + 1);
      ASSERT_NEAR(y.data<float>()[t * H + h], want, 1e-5 * (1 + std::fabs(want)));
    }
}

TEST(Permute, ZeroTokens) {
  RouteIndex idx;
  gen_idx(nullptr, 0, 4, 8, idx);
  EXPECT_EQ(idx.rows_in(0, 8), 0);
  CombineParams cp;
  cp.index = &idx;
  cp.hidden = 4;
  combine(cp);  // no tokens: nothing to touch
  SUCCEED();
}

}  // namespace
}  // namespace moe
