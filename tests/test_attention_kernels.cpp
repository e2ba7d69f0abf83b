// The blocked GQA attention (model/attention_kernels.h) against the plain loop: the
// same bits for prefill, decode and mixed steps of several sequences, head sizes that
// are and are not multiples of the vector width, every ISA level the CPU has, and an
// f32 or a bf16 KV cache (the kernel widens bf16 as it reads; the plain loop widens
// whole rows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "model/attention_kernels.h"
#include "test_util.h"
#include "test_isa.h"

namespace moe {
namespace {

struct Case {
  int64_t n_heads, n_kv, hd;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached positions, new tokens)
};

// paged: the cache is one pool of 8-position blocks handed to the slots in a shuffled
// order (as the server's scheduler hands out freed blocks), so a sequence's positions
// live in scattered, non-ascending blocks; the result must not change by a bit.
std::vector<float> run_case(const Case& c, uint64_t seed, bool paged = false, DType kv_dtype = DType::F32) {
  const int64_t max_seq = 80, n_slots = static_cast<int64_t>(c.seqs.size());
  KvCacheShape ks;
  ks.n_layers = 1;
  ks.n_slots = n_slots;
  ks.max_seq = max_seq;
  ks.a_dim = ks.b_dim = c.n_kv * c.hd;
  ks.block_size = paged ? 8 : 16;
  ks.dtype = kv_dtype;
  if (paged) ks.n_blocks = n_slots * ks.blocks_per_slot() + 3;  // a few spare blocks
  KvCache cache(ks);
  if (paged) {
    std::vector<int32_t> pool(ks.n_blocks);
    for (int32_t i = 0; i < ks.n_blocks; ++i) pool[i] = (i * 7 + 3) % static_cast<int32_t>(ks.n_blocks);  // 7 coprime
    for (int64_t s = 0; s < n_slots; ++s)
      cache.set_blocks(s, std::vector<int32_t>(pool.begin() + s * ks.blocks_per_slot(),
                                               pool.begin() + (s + 1) * ks.blocks_per_slot()));
  }
  const Tensor kv = test::random_f32({2, n_slots, max_seq, c.n_kv * c.hd}, 1.f, seed);
  for (int64_t s = 0; s < n_slots; ++s)
    for (int64_t p = 0; p < max_seq; ++p) {
      const float* src = kv.data<float>() + (s * max_seq + p) * c.n_kv * c.hd;
      cache.put_a(0, s, p, src);
      cache.put_b(0, s, p, src + n_slots * max_seq * c.n_kv * c.hd);
    }
  StepBatch b;
  for (int64_t s = 0; s < n_slots; ++s) {
    const auto [cached, n] = c.seqs[s];
    b.seqs.push_back({static_cast<int32_t>(s), b.n_tokens(), n, cached});
    for (int64_t i = 0; i < n; ++i) {
      b.tokens.push_back(0);
      b.positions.push_back(static_cast<int32_t>(cached + i));
    }
  }
  const int64_t T = b.n_tokens(), ld = c.n_heads * c.hd;
  const Tensor q = test::random_f32({T, ld}, 1.f, seed + 1);
  std::vector<float> ref(T * ld, -1.f), got(T * ld, -2.f);
  GqaAttendArgs a;
  a.batch = &b;
  a.cache = &cache;
  a.q = q.data<float>();
  a.n_heads = c.n_heads;
  a.n_kv = c.n_kv;
  a.head_dim = c.hd;
  a.scale = 0.3f;
  a.ctx = ref.data();
  gqa_attend_reference(a);
  for (Isa isa : test::available_isas()) {
    test::IsaScope scope(isa);
    a.ctx = got.data();
    gqa_attend(a);
    EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)), 0)
        << "heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd << " isa " << isa_name(active_isa()) << " cache "
        << dtype_name(kv_dtype);
  }
  return ref;
}

TEST(AttentionKernels, BitwiseEqualToThePlainLoop) {
  run_case({32, 4, 128, {{0, 37}}}, 1);                    // prefill, Qwen3-30B-A3B heads
  run_case({8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2);     // prefill + decode, head_dim not a multiple of 16
  run_case({4, 4, 16, {{10, 20}, {0, 1}}}, 3);            // MHA, chunked prefill after a cached prefix
  run_case({6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4);     // decode batch
}

TEST(AttentionKernels, Bf16CacheBitwiseEqualToThePlainLoop) {
  run_case({32, 4, 128, {{0, 37}}}, 1, false, DType::BF16);
  run_case({8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2, false, DType::BF16);
  run_case({4, 4, 16, {{10, 20}, {0, 1}}}, 3, false, DType::BF16);
  run_case({6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4, false, DType::BF16);
}

TEST(AttentionKernels, PagedScatteredBlocksGiveTheSameBits) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const auto& [c, seed] : std::vector<std::pair<Case, uint64_t>>{{{8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2},
                                                                       {{4, 4, 16, {{10, 20}, {0, 1}}}, 3},
                                                                       {{6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4}}) {
      const std::vector<float> dense = run_case(c, seed, false, dt), paged = run_case(c, seed, true, dt);
      ASSERT_EQ(dense.size(), paged.size());
      EXPECT_EQ(std::memcmp(dense.data(), paged.data(), dense.size() * sizeof(float)), 0)
          << "seed " << seed << " cache " << dtype_name(dt);
    }
}

// The bf16 cache really rounds (the outputs differ from the f32 cache's), and only by
// what rounding K and V to 8 significant bits allows. q, k, v ~ N(0, 1): rounding moves
// each k and v by up to 2^-9 relative (uniform, sd 2^-9/sqrt(3) = 0.0011 relative), so a
// score 0.3 q.k over hd = 128 moves with sd 0.3 sqrt(128) 0.0011 = 0.004, and an output
// (a convex combination of V rows) by that times |v| (a few) plus 2^-9 |v| from V
// itself: sd ~0.005-0.01. 5e-2 is 5-10 sd, for the max over ~150k outputs (observed
// 0.022).
TEST(AttentionKernels, Bf16CacheCloseToF32Cache) {
  for (const auto& [c, seed] : std::vector<std::pair<Case, uint64_t>>{{{32, 4, 128, {{0, 37}}}, 1},
                                                                     {{6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4}}) {
    const std::vector<float> f32 = run_case(c, seed), bf16 = run_case(c, seed, false, DType::BF16);
    double worst = 0;
    for (size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(f32[i] - bf16[i])));
    EXPECT_GT(worst, 0.0) << "seed " << seed << ": the bf16 cache did not round";
    EXPECT_LE(worst, 5e-2) << "seed " << seed;
  }
}

}  // namespace
}  // namespace moe
