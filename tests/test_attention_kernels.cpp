// The GQA flash attention (model/attention_kernels.h) against the plain loop: the
// same bits for prefill, decode and mixed steps of several sequences, head sizes that
// are and are not multiples of the vector width, contexts of many chunks and spans,
// both work schedules (whole context per item, one item per span), every ISA level the
// CPU has, a tiled or untiled K plane, and an f32 or a bf16 KV cache (the kernel widens
// bf16 as it reads; the plain loop widens whole rows). And against softmax attention
// computed in double precision: the chunked online softmax is the same function.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "model/attention_kernels.h"
#include "model/attention_math.h"
#include "test_util.h"
#include "test_isa.h"

namespace moe {
namespace {

struct Case {
  int64_t n_heads, n_kv, hd;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached positions, new tokens)
  int64_t max_seq = 80;
};

struct RunOpts {
  bool paged = false;      // 8-position blocks handed out shuffled (gathered K tiles)
  DType kv_dtype = DType::F32;
  bool tiled = true;       // K plane position-minor in its blocks, as the model keeps it
  bool head_major = true;  // V plane a run per KV head in its blocks, as the model keeps it
  int team = 0;            // > 0: run the kernel on a team of this many threads
};

// softmax(q k^T scale) v for every token and head, computed as torch does it in T
// (dot product, max-subtracted exp, sequential sums, normalise, weighted sum): in double
// it is the function without its rounding, in float the plain f32 computation.
template <class T>
std::vector<T> softmax_attention(const Case& c, const KvCache& cache, const StepBatch& b, const float* q,
                                 float scale) {
  const int64_t hd = c.hd, ld = c.n_heads * hd, G = c.n_heads / c.n_kv;
  std::vector<T> out(b.n_tokens() * ld);
  std::vector<float> kb(cache.a_dim()), vb(cache.b_dim());
  for (const SeqSpan& sp : b.seqs)
    for (int64_t t = sp.first; t < sp.first + sp.n; ++t)
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t n = b.positions[t] + 1, kvh = h / G;
        std::vector<T> s(n);
        T mx = -1e30f, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          const float* k = cache.row_a(0, sp.slot, j, kb.data()) + kvh * hd;
          T acc = 0;
          for (int64_t d = 0; d < hd; ++d) acc += static_cast<T>(q[t * ld + h * hd + d]) * k[d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += s[j] = std::exp(s[j] - mx);
        for (int64_t j = 0; j < n; ++j) {
          const float* v = cache.row_b(0, sp.slot, j, vb.data()) + kvh * hd;
          for (int64_t d = 0; d < hd; ++d) out[t * ld + h * hd + d] += s[j] / sum * v[d];
        }
      }
  return out;
}

std::vector<float> run_case(const Case& c, uint64_t seed, RunOpts ro = {}) {
  const bool paged = ro.paged;
  const DType kv_dtype = ro.kv_dtype;
  const int64_t max_seq = c.max_seq, n_slots = static_cast<int64_t>(c.seqs.size());
  KvCacheShape ks;
  ks.n_layers = 1;
  ks.n_slots = n_slots;
  ks.max_seq = max_seq;
  ks.a_dim = ks.b_dim = c.n_kv * c.hd;
  ks.block_size = paged ? 8 : 16;
  ks.dtype = kv_dtype;
  ks.a_tiled = ro.tiled;
  ks.b_heads = ro.head_major ? c.n_kv : 1;
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
  for (Isa isa : test::available_isas())
    for (GqaSchedule sched : {GqaSchedule::automatic, GqaSchedule::whole_context, GqaSchedule::split_spans}) {
      test::IsaScope scope(isa);
      a.ctx = got.data();
      a.schedule = sched;
      {
        test::TeamScope team(ro.team > 0 ? ro.team : omp_get_max_threads());
        gqa_attend(a);
      }
      EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)), 0)
          << "heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd << " isa " << isa_name(active_isa())
          << " cache " << dtype_name(kv_dtype) << " schedule " << static_cast<int>(sched) << " tiled " << ro.tiled
          << " head-major V " << ro.head_major << " team " << ro.team;
    }
  // The same function as softmax attention, and no less accurate in f32 than computing
  // it the plain way (as torch does): the chunks and folds only regroup the sums.
  if (kv_dtype == DType::F32) {
    const std::vector<double> want = softmax_attention<double>(c, cache, b, q.data<float>(), a.scale);
    const std::vector<float> plain = softmax_attention<float>(c, cache, b, q.data<float>(), a.scale);
    double worst = 0, worst_plain = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(want[i] - ref[i]));
      worst_plain = std::max(worst_plain, std::fabs(want[i] - plain[i]));
    }
    EXPECT_LE(worst, 1.5 * worst_plain + 1e-7) << "heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd
                                               << ": the plain f32 softmax is off by " << worst_plain;
  }
  return ref;
}

TEST(AttentionKernels, BitwiseEqualToThePlainLoop) {
  run_case({32, 4, 128, {{0, 37}}}, 1);                    // prefill, Qwen3-30B-A3B heads
  run_case({8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2);     // prefill + decode, head_dim not a multiple of 16
  run_case({4, 4, 16, {{10, 20}, {0, 1}}}, 3);            // MHA, chunked prefill after a cached prefix
  run_case({6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4);     // decode batch
}

// The exp of the online softmax (attn_math::exp_neg) against the C library's in double:
// within 2 ulp of the float result on [-87, 0] (the header's claim: the polynomial is
// accurate to < 2 ulp on the reduced interval), 0 below -87 and NaN for NaN, and each
// vector lane equal to the scalar, so kernel and plain loop share its bits.
TEST(AttentionMath, ExpWithinTwoUlpAndVectorEqualsScalar) {
  using namespace attn_math;
  double worst_ulp = 0;
  for (int i = 0; i <= 1 << 20; ++i) {
    const float x = -87.f * static_cast<float>(i) / (1 << 20);
    const float got = exp_neg(x);
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
    worst_ulp = std::max(worst_ulp, std::fabs(got - want) / ulp);
    if ((i & 255) == 0) {
      v16 xs = v16{} + x;
      xs[5] = -90.f;
      const v16 y = exp_neg(xs);
      ASSERT_EQ(std::memcmp(&y[0], &got, sizeof got), 0) << x;
      ASSERT_EQ(y[5], 0.f);
    }
  }
  EXPECT_LE(worst_ulp, 2.0);
  EXPECT_EQ(exp_neg(0.f), 1.f);
  EXPECT_EQ(exp_neg(-88.f), 0.f);
  EXPECT_EQ(exp_neg(-INFINITY), 0.f);
  EXPECT_TRUE(std::isnan(exp_neg(NAN)));
}

// Contexts of several spans (256 positions) and chunks (64): decode split over spans,
// prefill through all of them, a chunked prefill starting inside a span, a decode at a
// span boundary, 16 query heads per KV head.
TEST(AttentionKernels, LongContextsBitwiseEqualToThePlainLoop) {
  for (DType dt : {DType::F32, DType::BF16}) {
    RunOpts ro;
    ro.kv_dtype = dt;
    run_case({32, 4, 128, {{700, 1}, {255, 2}, {0, 300}}, 720}, 5, ro);
    run_case({16, 1, 64, {{511, 1}, {256, 1}, {100, 13}}, 720}, 6, ro);
    ro.paged = true;
    run_case({8, 2, 40, {{600, 1}, {77, 9}}, 720}, 7, ro);
  }
}

// A decode step with fewer items (KV heads x spans) than 2 a thread splits each KV head's
// query heads over 2, 4 ... items: every team size gives the plain loop's bits.
TEST(AttentionKernels, DecodeOnALargeTeamSplitsHeadsWithTheSameBits) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int team : {1, 3, 16, 64}) {
      RunOpts ro;
      ro.kv_dtype = dt;
      ro.team = team;
      run_case({32, 4, 128, {{511, 1}}, 520}, 8, ro);        // Qwen3-30B-A3B at 512: 8 items, G = 8
      run_case({16, 1, 64, {{300, 1}, {40, 2}}, 320}, 9, ro);  // G = 16, two sequences
      run_case({12, 4, 40, {{100, 1}}, 120}, 10, ro);        // G = 3: no power of 2 divides it
    }
}

// Untiled K and row-major V planes (rows, as MLA keeps its planes), alone or together,
// give the same bits as the model's layout, dense and paged, f32 and bf16.
TEST(AttentionKernels, PlaneLayoutsGiveTheSameBits) {
  for (DType dt : {DType::F32, DType::BF16})
    for (bool paged : {false, true})
      for (const Case& c :
           {Case{8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, Case{32, 4, 128, {{300, 1}, {0, 20}}, 400}}) {
        RunOpts model;
        model.kv_dtype = dt;
        model.paged = paged;
        const std::vector<float> x = run_case(c, 8, model);
        for (int layout = 1; layout < 4; ++layout) {
          RunOpts o = model;
          o.tiled = layout & 1 ? false : true;
          o.head_major = layout & 2 ? false : true;
          const std::vector<float> y = run_case(c, 8, o);
          EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
              << "tiled " << o.tiled << " head-major " << o.head_major << " paged " << paged << " "
              << dtype_name(dt);
        }
      }
}

TEST(AttentionKernels, Bf16CacheBitwiseEqualToThePlainLoop) {
  RunOpts bf;
  bf.kv_dtype = DType::BF16;
  run_case({32, 4, 128, {{0, 37}}}, 1, bf);
  run_case({8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2, bf);
  run_case({4, 4, 16, {{10, 20}, {0, 1}}}, 3, bf);
  run_case({6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4, bf);
}

TEST(AttentionKernels, PagedScatteredBlocksGiveTheSameBits) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const auto& [c, seed] : std::vector<std::pair<Case, uint64_t>>{{{8, 2, 24, {{0, 9}, {3, 1}, {60, 1}}}, 2},
                                                                       {{4, 4, 16, {{10, 20}, {0, 1}}}, 3},
                                                                       {{6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4}}) {
      RunOpts d, p;
      d.kv_dtype = p.kv_dtype = dt;
      p.paged = true;
      const std::vector<float> dense = run_case(c, seed, d), paged = run_case(c, seed, p);
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
// MLA's latent attention (mla_attend, 16 heads in the vector lanes) against its
// definition, the plain loop mla_attend_reference: the same bits on every ISA level the
// CPU has, on 1 or 2 threads, for a step that mixes a prompt, a decode step at 258
// positions (5 chunks, 2 spans) and a short continuation, head counts under, over and at
// 16 lanes, latent and rope sizes that are and are not multiples of the 6-wide blocks, f32
// and bf16 caches, each token's whole context in one item or one item per span (merged),
// and the step's tokens in one call or in two chunks. And the softmax attention
// it computes, in double precision, as close as the plain f32 loop (one chain per dot
// product, one softmax over all keys) comes.
TEST(AttentionKernels, MlaSameBitsAsItsDefinitionOnEveryIsaAndNearDouble) {
  const int64_t max_seq = 272;
  // (cached positions, new tokens) per sequence, one slot each.
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{0, 37}, {258, 1}, {70, 3}};
  struct Dims {
    int64_t L, R, nh;
  };
  for (const Dims& dm : {Dims{512, 64, 20}, Dims{20, 5, 3}, Dims{96, 33, 16}})
    for (DType dt : {DType::F32, DType::BF16}) {
      const int64_t L = dm.L, R = dm.R, nh = dm.nh;
      SCOPED_TRACE("kv_lora " + std::to_string(L) + " rope " + std::to_string(R) + " heads " + std::to_string(nh) +
                   " " + dtype_name(dt));
      KvCacheShape ks;
      ks.n_layers = 1;
      ks.n_slots = static_cast<int64_t>(seqs.size());
      ks.max_seq = max_seq;
      ks.a_dim = L;
      ks.b_dim = R;
      ks.dtype = dt;
      KvCache cache(ks);  // rows, as the model keeps MLA's latent cache
      StepBatch b;
      for (size_t q = 0; q < seqs.size(); ++q) {
        const auto [cached, n] = seqs[q];
        b.seqs.push_back({static_cast<int32_t>(q), b.n_tokens(), n, cached});
        for (int64_t i = 0; i < n; ++i) {
          b.tokens.push_back(0);
          b.positions.push_back(static_cast<int32_t>(cached + i));
        }
        const Tensor rows = test::random_f32({cached + n, L + R}, 1.f, 11 + q);
        for (int64_t j = 0; j < cached + n; ++j) {
          cache.put_a(0, static_cast<int64_t>(q), j, rows.data<float>() + j * (L + R));
          cache.put_b(0, static_cast<int64_t>(q), j, rows.data<float>() + j * (L + R) + L);
        }
      }
      const int64_t T = b.n_tokens(), pe_ld_h = R + 3;  // a stride that is not R
      const Tensor q_lat = test::random_f32({nh, T, L}, 1.f, 21);
      const Tensor q_pe = test::random_f32({T, nh, pe_ld_h}, 1.f, 22);
      MlaAttendArgs a;
      a.batch = &b;
      a.cache = &cache;
      a.t0 = 0;
      a.tc = T;
      a.n_heads = nh;
      a.q_lat = q_lat.data<float>();
      a.q_pe = q_pe.data<float>();
      a.pe_ld_t = nh * pe_ld_h;
      a.pe_ld_h = pe_ld_h;
      a.scale = 0.05f;
      std::vector<float> want(nh * T * L), got(nh * T * L);
      a.o_lat = want.data();
      mla_attend_reference(a);
      const int before = omp_get_max_threads();
      for (Isa isa : test::available_isas())
        for (int threads : {1, 2})
          for (GqaSchedule sched : {GqaSchedule::automatic, GqaSchedule::whole_context, GqaSchedule::split_spans}) {
            test::IsaScope scope(isa);
            omp_set_num_threads(threads);
            std::fill(got.begin(), got.end(), -1.f);
            a.o_lat = got.data();
            a.schedule = sched;
            mla_attend(a);
            omp_set_num_threads(before);
            EXPECT_EQ(std::memcmp(want.data(), got.data(), got.size() * sizeof(float)), 0)
                << "isa " << isa_name(isa) << ", " << threads << " threads, schedule " << static_cast<int>(sched);
          }
      a.schedule = GqaSchedule::automatic;
      // The decode token alone (258 positions: 2 spans) on a team of 16: under 2 items a
      // thread, so the automatic schedule splits it by span and merges.
      {
        std::vector<float> ql(nh * L), out(nh * L, -1.f);
        for (int64_t h = 0; h < nh; ++h)
          std::memcpy(ql.data() + h * L, q_lat.data<float>() + (h * T + 37) * L, L * sizeof(float));
        MlaAttendArgs one = a;
        one.t0 = 37;
        one.tc = 1;
        one.q_lat = ql.data();
        one.o_lat = out.data();
        omp_set_num_threads(16);
        mla_attend(one);
        omp_set_num_threads(before);
        for (int64_t h = 0; h < nh; ++h)
          EXPECT_EQ(std::memcmp(out.data() + h * L, want.data() + (h * T + 37) * L, L * sizeof(float)), 0)
              << "the decode token alone, head " << h;
      }
      // The same tokens in two calls (t0 = 0, 30; each call's rows head-major over its tc).
      for (const auto& [t0, tc] : {std::pair<int64_t, int64_t>{0, 30}, {30, T - 30}}) {
        std::vector<float> ql(nh * tc * L), out(nh * tc * L);
        for (int64_t h = 0; h < nh; ++h)
          std::memcpy(ql.data() + h * tc * L, q_lat.data<float>() + (h * T + t0) * L, tc * L * sizeof(float));
        MlaAttendArgs part = a;
        part.t0 = t0;
        part.tc = tc;
        part.q_lat = ql.data();
        part.o_lat = out.data();
        mla_attend(part);
        for (int64_t h = 0; h < nh; ++h)
          EXPECT_EQ(std::memcmp(out.data() + h * tc * L, want.data() + (h * T + t0) * L, tc * L * sizeof(float)), 0)
              << "tokens from " << t0 << ", head " << h;
      }
      // Softmax attention of the cached values (rounded to bf16 by a bf16 cache), in double
      // and as a plain f32 loop computes it, for the decode step's token (258 positions).
      const int64_t t = 37;
      std::vector<float> ca(L), cb(R);
      auto attention = [&](auto zero, int64_t h) {
        using F = decltype(zero);
        const int64_t n_ctx = b.positions[t] + 1;
        const float* ql = q_lat.data<float>() + (h * T + t) * L;
        const float* qp = q_pe.data<float>() + t * a.pe_ld_t + h * pe_ld_h;
        std::vector<F> sc(n_ctx), o(L, F(0));
        F mx = -1e30, sum = 0;
        for (int64_t j = 0; j < n_ctx; ++j) {
          const float* c = cache.row_a(0, 1, j, ca.data());
          const float* p = cache.row_b(0, 1, j, cb.data());
          F acc = 0;
          for (int64_t l = 0; l < L; ++l) acc += static_cast<F>(ql[l]) * c[l];
          for (int64_t r = 0; r < R; ++r) acc += static_cast<F>(qp[r]) * p[r];
          sc[j] = acc * static_cast<F>(a.scale);
          mx = std::max(mx, sc[j]);
        }
        for (int64_t j = 0; j < n_ctx; ++j) sum += sc[j] = std::exp(sc[j] - mx);
        for (int64_t j = 0; j < n_ctx; ++j) {
          const float* c = cache.row_a(0, 1, j, ca.data());
          for (int64_t l = 0; l < L; ++l) o[l] += sc[j] / sum * c[l];
        }
        return o;
      };
      double worst = 0, worst_plain = 0;
      for (int64_t h = 0; h < nh; ++h) {
        const std::vector<double> exact = attention(0.0, h);
        const std::vector<float> plain = attention(0.f, h);
        for (int64_t l = 0; l < L; ++l) {
          worst = std::max(worst, std::fabs(exact[l] - want[(h * T + t) * L + l]));
          worst_plain = std::max(worst_plain, std::fabs(exact[l] - plain[l]));
        }
      }
      EXPECT_LE(worst, 1.5 * worst_plain + 1e-7) << "the plain f32 loop is off by " << worst_plain;
    }
}

TEST(AttentionKernels, Bf16CacheCloseToF32Cache) {
  for (const auto& [c, seed] : std::vector<std::pair<Case, uint64_t>>{{{32, 4, 128, {{0, 37}}}, 1},
                                                                     {{6, 2, 32, {{70, 1}, {5, 1}, {0, 3}}}, 4}}) {
    RunOpts bf;
    bf.kv_dtype = DType::BF16;
    const std::vector<float> f32 = run_case(c, seed), bf16 = run_case(c, seed, bf);
    double worst = 0;
    for (size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(f32[i] - bf16[i])));
    EXPECT_GT(worst, 0.0) << "seed " << seed << ": the bf16 cache did not round";
    EXPECT_LE(worst, 5e-2) << "seed " << seed;
  }
}

}  // namespace
}  // namespace moe
