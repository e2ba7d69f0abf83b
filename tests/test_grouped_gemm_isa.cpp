// The SIMD float kernels (AVX2 and AVX-512 f32, AVX2 and AVX-512 bf16 without
// AVX512_BF16) promise more than closeness to the reference: per output they run one f32
// chain over k in order with one fused multiply-add per product (bf16: the even k of a
// pair, then the odd), so they must equal, bit for bit, a scalar model that does exactly
// that with std::fma -- and therefore each other, whatever the ISA. And a row's result
// must not depend on which other rows share the call (batch invariance), on every ISA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "kernels/quant.h"
#include "test_isa.h"
#include "test_util.h"

namespace moe {
namespace {

using test::IsaScope;
using test::available_isas;

Tensor random_f32(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

// The FMA-chain model of one output row: acc[n] = fma(a[k], w[n, k], acc[n]) for
// k = 0..K-1 (bf16 weights and activations hold bf16 values; the kernels run an odd K's
// last pair with a zero odd half: one more fma(0, 0, acc), which turns -0 into +0), then
// the epilogue.
void fma_model_row(const std::vector<float>& a, const Tensor& w, bool gated, Activation act, DType w_dtype,
                   DType c_dtype, std::vector<uint8_t>& out) {
  const int64_t N = w.dim(0), K = w.dim(1), n_out = gated ? N / 2 : N;
  std::vector<float> acc(N, 0.0f), res(n_out);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) acc[n] = std::fma(a[k], w.data<float>()[n * K + k], acc[n]);
    if (w_dtype == DType::BF16 && K % 2 == 1) acc[n] = std::fma(0.0f, 0.0f, acc[n]);
  }
  for (int64_t c = 0; c < n_out; ++c) res[c] = gated ? act_gate(act, acc[c]) * acc[n_out + c] : acc[c];
  out.resize(n_out * dtype_size(c_dtype));
  convert_from_f32(res.data(), out.data(), c_dtype, n_out);
}

struct IsaCase {
  int64_t n, k;
  bool gated;
  std::vector<int64_t> rows;
};

const std::vector<IsaCase>& isa_cases() {
  static const std::vector<IsaCase> c = {
      {64, 48, true, {1, 2, 3, 4, 5, 6, 7, 13}},  // every row-block size, one panel
      {130, 33, false, {1, 9, 4}},                 // tail panel, odd k
      {96, 2048, true, {1, 3, 20}},                // long K, a half-panel tail (I = 48)
      {2, 7, true, {2, 1}},                        // I = 1
  };
  return c;
}

// The kernels that promise FMA-chain bits at this ISA level (the portable loop and
// vdpbf16ps do not: their own tests bound them against the reference).
bool promises_fma_bits(Isa isa, DType dt) {
  if (isa == Isa::Avx2) return true;
  if (isa == Isa::Avx512) return true;               // f32 FMA and bf16 emulation
  if (isa >= Isa::Avx512Bf16) return dt == DType::F32;  // bf16 runs vdpbf16ps there, tiles at amx
  return false;
}

TEST(GroupedGemmIsa, SimdFloatKernelsEqualTheFmaChainModelBitForBit) {
  int checked = 0;
  uint32_t seed = 3;
  for (const IsaCase& cs : isa_cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      const int64_t E = static_cast<int64_t>(cs.rows.size());
      PackedExperts w = make_packed_experts(E, cs.n, cs.k, dt, cs.gated);
      std::vector<Tensor> wu;
      for (int64_t e = 0; e < E; ++e) {
        pack_expert(w, e, random_f32({cs.n, cs.k}, seed + 7 * e));
        wu.push_back(unpack_expert(w, e));  // f32 [n, k]: the exact packed values
      }
      std::vector<int64_t> off(E + 1, 0);
      for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + cs.rows[e];
      const int64_t R = off[E];
      const Tensor a = random_f32({R, cs.k}, seed + 100).to(dt);
      const Tensor af = a.to(DType::F32);
      ++seed;
      for (Activation act : cs.gated ? std::vector<Activation>{Activation::SiluMul, Activation::GeluErfMul}
                                     : std::vector<Activation>{Activation::None}) {
        for (DType cd : {DType::F32, DType::BF16}) {
          const int64_t n_out = w.n_out();
          for (Isa isa : available_isas()) {
            if (!promises_fma_bits(isa, dt)) continue;
            IsaScope scope(isa);
            Tensor c = Tensor::zeros({R, n_out}, cd);
            GroupedGemmParams p;
            p.w = &w;
            p.a = a.raw();
            p.lda = cs.k;
            p.offsets = off.data();
            p.c = c.raw();
            p.c_dtype = cd;
            p.ldc = n_out;
            p.act = act;
            grouped_gemm(p);
            std::vector<uint8_t> want;
            for (int64_t e = 0; e < E; ++e) {
              for (int64_t r = off[e]; r < off[e + 1]; ++r) {
                const std::vector<float> arow(af.data<float>() + r * cs.k, af.data<float>() + (r + 1) * cs.k);
                fma_model_row(arow, wu[e], cs.gated, act, dt, cd, want);
                const auto* got = static_cast<const uint8_t*>(c.raw()) + r * n_out * dtype_size(cd);
                ASSERT_EQ(std::memcmp(got, want.data(), want.size()), 0)
                    << isa_name(isa) << " w=" << dtype_name(dt) << " c=" << dtype_name(cd) << " n=" << cs.n
                    << " k=" << cs.k << " act=" << int(act) << " expert " << e << " row " << r;
              }
            }
            ++checked;
          }
        }
      }
    }
  }
  // This CPU has AVX2 or better wherever the suite runs (x86-64 servers since 2013);
  // a run that checked nothing would prove nothing.
  if (active_isa() >= Isa::Avx2) {
    EXPECT_GT(checked, 0);
  }
}

// Row r of an expert alone gives the same bits as within any batch, for every ISA and
// weight dtype (f32, bf16, i8): the kernels' blocking of rows must not reach the numbers.
TEST(GroupedGemmIsa, RowResultsDoNotDependOnTheBatch) {
  const int64_t n = 96, k = 320;  // gated I = 48: a full and a half panel
  for (DType dt : {DType::F32, DType::BF16}) {
    PackedExperts w = make_packed_experts(1, n, k, dt, true);
    pack_expert(w, 0, random_f32({n, k}, 77));
    for (Isa isa : available_isas()) {
      IsaScope scope(isa);
      const int64_t R = 37;  // AMX: row blocks of 13, 12 and 12
      const Tensor a = random_f32({R, k}, 78).to(dt);
      auto run = [&](int64_t r0, int64_t rows) {
        Tensor c = Tensor::zeros({rows, n / 2}, DType::F32);
        std::vector<int64_t> off = {0, rows};
        GroupedGemmParams p;
        p.w = &w;
        p.a = static_cast<const char*>(a.raw()) + r0 * k * dtype_size(dt);
        p.lda = k;
        p.offsets = off.data();
        p.c = c.raw();
        p.ldc = n / 2;
        p.act = Activation::SiluMul;
        grouped_gemm(p);
        return c;
      };
      const Tensor all = run(0, R);
      for (int64_t rows : {1, 2, 3, 4, 5, 6, 7}) {
        for (int64_t r0 = 0; r0 + rows <= R; r0 += 5) {
          const Tensor part = run(r0, rows);
          ASSERT_EQ(std::memcmp(part.raw(), all.data<float>() + r0 * (n / 2), part.nbytes()), 0)
              << isa_name(isa) << " " << dtype_name(dt) << " rows [" << r0 << ", " << r0 + rows << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

// grouped_gemm_many runs several GEMMs (different weights, dtypes, expert counts, rows and
// outputs) in one parallel region: each output equals its grouped_gemm alone, bit for
// bit, on every ISA, at decode (one row) and prefill sizes.
TEST(GroupedGemmIsa, ManyGemmsInOneRegionEqualEachAlone) {
  struct One {
    PackedExperts w;
    std::vector<int64_t> offsets;
    std::vector<char> a;
    int64_t lda = 0;
    Activation act = Activation::None;
  };
  for (const int64_t rows : {int64_t{1}, int64_t{37}}) {
    std::vector<One> ones;
    auto add = [&](DType dt, int64_t E, int64_t n, int64_t k, bool gated, uint32_t seed) {
      One o;
      o.w = make_packed_experts(E, n, k, dt, gated);
      for (int64_t e = 0; e < E; ++e) pack_expert(o.w, e, random_f32({n, k}, seed + static_cast<uint32_t>(e)));
      o.offsets.assign(static_cast<size_t>(E) + 1, 0);
      for (int64_t e = 0; e < E; ++e) o.offsets[e + 1] = o.offsets[e] + (rows + e) / E;  // uneven, some empty
      const int64_t R = o.offsets[E];
      const Tensor x = random_f32({std::max<int64_t>(R, 1), k}, seed + 100);
      if (dt == DType::I8) {
        o.lda = q8_row_bytes(k);
        o.a.resize(static_cast<size_t>(std::max<int64_t>(R, 1) * o.lda));
        for (int64_t r = 0; r < R; ++r)
          quantize_row_q8_reference(x.data<float>() + r * k, nullptr, k, o.a.data() + r * o.lda);
      } else {
        o.lda = k;
        o.a.resize(static_cast<size_t>(std::max<int64_t>(R, 1) * k) * dtype_size(dt));
        convert_from_f32(x.data<float>(), o.a.data(), dt, R * k);
      }
      o.act = gated ? Activation::SiluMul : Activation::None;
      ones.push_back(std::move(o));
    };
    add(DType::F32, 1, 130, 48, false, 1);
    add(DType::BF16, 3, 64, 66, true, 2);
    add(DType::I8, 2, 96, 64, false, 3);
    add(DType::F32, 1, 512, 256, false, 4);  // big enough to wake the team on its own
    for (Isa isa : available_isas()) {
      IsaScope scope(isa);
      std::vector<std::vector<float>> alone(ones.size()), many(ones.size());
      std::vector<GroupedGemmParams> ps;
      for (size_t i = 0; i < ones.size(); ++i) {
        const One& o = ones[i];
        const int64_t R = o.offsets.back(), n_out = o.w.n_out();
        alone[i].assign(static_cast<size_t>(std::max<int64_t>(R, 1) * n_out), 0.f);
        many[i].assign(alone[i].size(), NAN);
        GroupedGemmParams p;
        p.w = &o.w;
        p.a = o.a.data();
        p.lda = o.lda;
        p.offsets = o.offsets.data();
        p.c = alone[i].data();
        p.ldc = n_out;
        p.act = o.act;
        grouped_gemm(p);
        p.c = many[i].data();
        ps.push_back(p);
      }
      grouped_gemm_many(ps);
      for (size_t i = 0; i < ones.size(); ++i)
        ASSERT_EQ(0, std::memcmp(alone[i].data(), many[i].data(), alone[i].size() * sizeof(float)))
            << isa_name(isa) << " GEMM " << i << " rows " << rows;
    }
  }
}


// A decode GEMV of f32 weights with fewer panels than threads (the router: 128 outputs, 2
// panels) is cut into column windows of 32 or 16 columns; each column keeps its chain, so
// every team size gives the bits of one thread, which for the FMA kernels are the
// chain model's. Prefill rows and bf16 weights keep whole panels.
TEST(GroupedGemmIsa, ColumnWindowsOfADecodeGemvEqualOneThreadBitForBit) {
  struct Case {
    int64_t n, k;
    std::vector<int64_t> rows;  // per expert
    int64_t windows_16;         // tasks at 16 threads: windows holding a valid column
  };
  const std::vector<Case> cases = {
      {128, 2048, {1}, 8},     // the router of Qwen3-30B-A3B: 2 panels
      {128, 256, {4}, 8},      // every row a decode task may have
      {60, 33, {3}, 4},        // one panel, its last window part padding
      {130, 100, {2, 1}, 18},  // 3 panels of 2 experts; the third holds 2 columns: 1 window
  };
  int windowed = 0;
  uint32_t seed = 900;
  for (const Case& cs : cases) {
    const int64_t E = static_cast<int64_t>(cs.rows.size());
    PackedExperts w = make_packed_experts(E, cs.n, cs.k, DType::F32, false);
    std::vector<Tensor> wu;
    for (int64_t e = 0; e < E; ++e) {
      pack_expert(w, e, random_f32({cs.n, cs.k}, seed + static_cast<uint32_t>(e)));
      wu.push_back(unpack_expert(w, e));
    }
    std::vector<int64_t> off(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + cs.rows[e];
    const int64_t R = off[E];
    const Tensor a = random_f32({R, cs.k}, seed + 50);
    ++seed;
    GroupedGemmParams p;
    p.w = &w;
    p.a = a.raw();
    p.lda = cs.k;
    p.offsets = off.data();
    p.c_dtype = DType::F32;
    p.ldc = cs.n;
    Tensor out = Tensor::empty({R, cs.n}, DType::F32);
    p.c = out.raw();
    const int64_t panels = E * ((cs.n + 63) / 64);
    EXPECT_EQ(grouped_gemm_task_count(p, 1), panels) << "n=" << cs.n;
    EXPECT_EQ(grouped_gemm_task_count(p, 16), cs.windows_16) << "n=" << cs.n;
    for (Isa isa : available_isas()) {
      IsaScope scope(isa);
      auto run = [&](int threads) {
        test::TeamScope team(threads);
        std::fill_n(out.data<float>(), out.numel(), 7.0f);  // every column must be written
        grouped_gemm(p);
        return out.clone();
      };
      const Tensor one = run(1);
      if (promises_fma_bits(isa, DType::F32)) {
        std::vector<uint8_t> want;
        for (int64_t e = 0; e < E; ++e)
          for (int64_t r = off[e]; r < off[e + 1]; ++r) {
            const std::vector<float> arow(a.data<float>() + r * cs.k, a.data<float>() + (r + 1) * cs.k);
            fma_model_row(arow, wu[e], false, Activation::None, DType::F32, DType::F32, want);
            ASSERT_EQ(std::memcmp(one.data<float>() + r * cs.n, want.data(), want.size()), 0)
                << isa_name(isa) << " n=" << cs.n << " row " << r;
          }
      }
      for (int threads : {2, 3, 5, 16}) {
        if (grouped_gemm_task_count(p, threads) > panels) ++windowed;
        const Tensor many = run(threads);
        ASSERT_EQ(std::memcmp(many.raw(), one.raw(), one.nbytes()), 0)
            << isa_name(isa) << " n=" << cs.n << " k=" << cs.k << " threads " << threads;
      }
    }
  }
  EXPECT_GT(windowed, 0);
  // Not windowed: prefill rows, and weights other than f32.
  PackedExperts w = make_packed_experts(1, 128, 64, DType::F32, false);
  pack_expert(w, 0, random_f32({128, 64}, 5));
  const std::vector<int64_t> prefill = {0, 5};
  GroupedGemmParams p;
  p.w = &w;
  p.a = p.c = &w;  // not read: only the tasks are counted
  p.lda = 64;
  p.ldc = 128;
  p.offsets = prefill.data();
  EXPECT_EQ(grouped_gemm_task_count(p, 16), 2);
  PackedExperts wb = make_packed_experts(1, 128, 64, DType::BF16, false);
  const std::vector<int64_t> decode = {0, 1};
  p.w = &wb;
  p.offsets = decode.data();
  EXPECT_EQ(grouped_gemm_task_count(p, 16), 2);
}

}  // namespace
}  // namespace moe
