// The blocked GQA attention (model/attention_kernels.h) against the plain loop: the
// same bits for prefill, decode and mixed steps of several sequences, head sizes that
// are and are not multiples of the vector width, and every ISA level the CPU has.
#include <gtest/gtest.h>

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
std::vector<float> run_case(const Case& c, uint64_t seed, bool paged = false) {
  const int64_t max_seq = 80, n_slots = static_cast<int64_t>(c.seqs.size());
  KvCacheShape ks;
  ks.n_layers = 1;
  ks.n_slots = n_slots;
  ks.max_seq = max_seq;
  ks.a_dim = ks.b_dim = c.n_kv * c.hd;
  ks.block_size = paged ? 8 : 16;
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
      std::memcpy(cache.a(0, s, p), src, c.n_kv * c.hd * sizeof(float));
      std::memcpy(cache.b(0, s, p), src + n_slots * max_seq * c.n_kv * c.hd, c.n_kv * c.hd * sizeof(float));
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
        << "heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd << " isa " << isa_name(active_isa());
  }
  return ref;
}

TEST(AttentionKernels, BitwiseEqualToThePlainLoop) {
  run_case({32, 4, 128, {{0, 37}}}, 1);                    // prefill, Qwen3-30B-A3B heads
  run_case({8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2);     // prefill + decode, head_dim not a multiple of 16
  run_case({4, 4, 16, {{10, 20}, {0, 1}}}, 3);            // MHA, chunked prefill after a cached prefix
  run_case({6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4);     // decode batch
}

TEST(AttentionKernels, PagedScatteredBlocksGiveTheSameBits) {
  for (const auto& [c, seed] : std::vector<std::pair<Case, uint64_t>>{{{8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2},
                                                                     {{4, 4, 16, {{10, 20}, {0, 1}}}, 3},
                                                                     {{6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4}}) {
    const std::vector<float> dense = run_case(c, seed), paged = run_case(c, seed, true);
    ASSERT_EQ(dense.size(), paged.size());
    EXPECT_EQ(std::memcmp(dense.data(), paged.data(), dense.size() * sizeof(float)), 0) << "seed " << seed;
  }
}

}  // namespace
}  // namespace moe
