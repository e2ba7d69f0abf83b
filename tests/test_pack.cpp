// Packing (kernels/pack.cpp): the direct, cache-blocked packers (portable and AVX-512)
// give exactly the bytes of the original algorithm (each element converted to f32, then
// scattered one at a time into a zeroed buffer), for every source and packed dtype,
// including NaN payloads, infinities, subnormals and rounding ties, with every padding
// byte written; gate and up packed separately equal their stacked rows; the loader packs
// exactly the checkpoint's rows.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/grouped_gemm.h"
#include "test_isa.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "moe/config.h"
#include "test_util.h"

namespace moe {
namespace {

using test::IsaScope;

// The packers differ only between portable and AVX-512 (pack.cpp dispatches on >= Avx512).
// Every level this CPU runs: the portable, AVX2 and AVX-512 packers (AVX512_BF16 packs
// with the AVX-512 one).
std::vector<Isa> packer_isas() { return test::available_isas(); }

// Random bit patterns of `dt` (every class of value occurs: about 1/256 of f32 and 1/32
// of f16 patterns are NaN/Inf, as many are subnormal), with special values planted.
Tensor random_bits(const Shape& shape, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dt);
  std::mt19937 rng(seed);
  const int64_t n = t.numel();
  if (dt == DType::F32) {
    uint32_t* p = static_cast<uint32_t*>(t.raw());
    for (int64_t i = 0; i < n; ++i) p[i] = rng();
    // f32 -> bf16 rounding cases: exact ties with even and odd lsb, just above a tie,
    // the largest finite value (rounds to Inf), a signalling NaN, the smallest subnormal.
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xff7fffffu,
                                0x7f800001u, 0xff800000u, 0x00000001u, 0x807fffffu, 0x80000000u};
    for (int64_t i = 0; i < n; i += 7) p[i] = special[(i / 7) % std::size(special)];
  } else {
    uint16_t* p = static_cast<uint16_t*>(t.raw());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(rng());
    // f16: signalling and quiet NaN with payloads, Inf, subnormals, the largest finite.
    const uint16_t special[] = {0x7c01u, 0xfd55u, 0x7c00u, 0x0001u, 0x83ffu, 0x7bffu, 0x8000u};
    if (dt == DType::F16)
      for (int64_t i = 0; i < n; i += 5) p[i] = special[(i / 5) % std::size(special)];
  }
  return t;
}

// The packing algorithm as it was before pack.cpp, written plainly: the whole source
// converted to f32 (Tensor::to), then each element scattered into a zeroed expert slot
// (f32: [K][64] per panel; bf16: [ceil(K/2)][64][2], f32_to_bf16). Returns the slot bytes.
std::vector<uint8_t> reference_slot(const Tensor& w, bool gated, DType dst) {
  const Tensor wf = w.to(DType::F32);
  const float* src = wf.data<float>();
  const int64_t n = w.dim(0), K = w.dim(1), half = n / 2;
  const int64_t panels = gated ? (half + 31) / 32 : (n + 63) / 64;
  const int64_t panel_elems = dst == DType::BF16 ? (K + 1) / 2 * 64 * 2 : K * 64;
  const size_t es = dtype_size(dst);
  std::vector<uint8_t> out(panels * panel_elems * es, 0);
  for (int64_t P = 0; P < panels; ++P)
    for (int j = 0; j < 64; ++j) {
      int64_t row;
      if (gated) {
        const int64_t c = P * 32 + j % 32;
        row = c >= half ? -1 : j < 32 ? c : half + c;
      } else {
        row = P * 64 + j < n ? P * 64 + j : -1;
      }
      if (row < 0) continue;
      for (int64_t k = 0; k < K; ++k) {
        const float v = src[row * K + k];
        uint8_t* panel = out.data() + P * panel_elems * es;
        if (dst == DType::F32) {
          std::memcpy(panel + (k * 64 + j) * 4, &v, 4);
        } else {
          const uint16_t b = f32_to_bf16(v);
          std::memcpy(panel + (((k / 2) * 64 + j) * 2 + (k & 1)) * 2, &b, 2);
        }
      }
    }
  return out;
}

const uint8_t* slot(const PackedExperts& p, int64_t e) {
  return static_cast<const uint8_t*>(p.data.raw()) + e * p.bytes_per_expert();
}

// First differing byte of expert e's slot against `want`, or -1.
int64_t first_diff(const PackedExperts& p, int64_t e, const std::vector<uint8_t>& want) {
  if (want.size() != p.bytes_per_expert()) return -2;
  const uint8_t* got = slot(p, e);
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  return -1;
}

// Rows [0, rows) and [rows, 2 rows) of w as two tensors of their own (copies).
std::pair<Tensor, Tensor> split_rows(const Tensor& w) {
  const int64_t half = w.dim(0) / 2;
  return {w.slice_rows(0, half).clone(), w.slice_rows(half, w.dim(0)).clone()};
}

struct Case {
  int64_t n, k;
  bool gated;
};
// n not a multiple of 64 (partial and padding panels), odd K, K past one 16-step block
// (bf16 steps are K/2), a single column, a single k.
const Case kCases[] = {{2, 1, true},     {64, 2, false},   {130, 7, false}, {1, 3, false},  {48, 40, true},
                       {200, 33, true},  {128, 64, true},  {70, 47, false}, {96, 67, true}, {64, 1024, false},
                       {192, 131, true}, {65, 100, false}};

TEST(Pack, MatchesTheElementwiseReferenceForEveryDtypeAndIsa) {
  for (Isa isa : packer_isas()) {
    IsaScope scope(isa);
    for (const Case& c : kCases)
      for (DType src : {DType::F32, DType::BF16, DType::F16})
        for (DType dst : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(testing::Message() << isa_name(isa) << " n=" << c.n << " k=" << c.k << " gated=" << c.gated
                                          << " " << dtype_name(src) << " -> " << dtype_name(dst));
          PackedExperts p = make_packed_experts(2, c.n, c.k, dst, c.gated);
          // Garbage first: the packer must write every byte of the slot, padding included.
          std::memset(p.data.raw(), 0xa5, p.data.nbytes());
          for (int64_t e = 0; e < 2; ++e) {
            const Tensor w = random_bits({c.n, c.k}, src, static_cast<uint32_t>(1000 * c.n + 10 * c.k + e));
            if (c.gated && e == 1) {
              const auto [g, u] = split_rows(w);
              pack_expert_gated(p, e, g, u);
            } else {
              pack_expert(p, e, w);
            }
            ASSERT_EQ(first_diff(p, e, reference_slot(w, c.gated, dst)), -1) << "expert " << e;
          }
        }
  }
}

// unpack_expert inverts packing: every element comes back as its value in the packed
// dtype (bits compared, so NaN payloads count).
TEST(Pack, UnpackReturnsTheConvertedSource) {
  for (Isa isa : packer_isas()) {
    IsaScope scope(isa);
    for (const Case& c : kCases)
      for (DType src : {DType::F32, DType::BF16, DType::F16})
        for (DType dst : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(testing::Message() << isa_name(isa) << " n=" << c.n << " k=" << c.k << " "
                                          << dtype_name(src) << " -> " << dtype_name(dst));
          const Tensor w = random_bits({c.n, c.k}, src, 7);
          PackedExperts p = make_packed_experts(1, c.n, c.k, dst, c.gated);
          pack_expert(p, 0, w);
          const Tensor u = unpack_expert(p, 0), wf = w.to(DType::F32);
          for (int64_t i = 0; i < w.numel(); ++i) {
            const float v = wf.data<float>()[i];
            const float want = dst == DType::F32 ? v : round_bf16(v);
            ASSERT_EQ(std::memcmp(&want, u.data<float>() + i, 4), 0) << "element " << i;
          }
        }
  }
}

// A row that ends where readable memory ends (the last tensor of an mmapped file): the
// packer must not read past it, whatever K's parity and the tail of its last block.
TEST(Pack, ReadsNothingPastTheLastRow) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (Isa isa : packer_isas()) {
    IsaScope scope(isa);
    for (const Case& c : {Case{70, 47, false}, Case{96, 67, true}, Case{2, 1, true}})
      for (DType src : {DType::F32, DType::BF16, DType::F16})
        for (DType dst : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(testing::Message() << isa_name(isa) << " k=" << c.k << " " << dtype_name(src) << " -> "
                                          << dtype_name(dst));
          const Tensor w = random_bits({c.n, c.k}, src, 3);
          const size_t bytes = w.nbytes(), data_pages = (bytes + page - 1) / page;
          void* m = mmap(nullptr, (data_pages + 1) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          ASSERT_NE(m, MAP_FAILED);
          char* guard = static_cast<char*>(m) + data_pages * page;
          ASSERT_EQ(mprotect(guard, page, PROT_NONE), 0);  // any read past the data faults
          std::memcpy(guard - bytes, w.raw(), bytes);
          const Tensor at_end = Tensor::wrap(guard - bytes, w.shape(), src, nullptr);
          PackedExperts p = make_packed_experts(1, c.n, c.k, dst, c.gated);
          pack_expert(p, 0, at_end);
          EXPECT_EQ(first_diff(p, 0, reference_slot(w, c.gated, dst)), -1);
          munmap(m, (data_pages + 1) * page);
        }
  }
}

// make_packed_experts takes its storage zeroed without a memset from 2 MiB up
// (zeroed_huge_pages): small and large buffers alike read as zeros before any packing,
// so an expert never packed computes as zeros, and the storage is aligned for the
// packers' 64-byte stores.
TEST(Pack, StorageStartsZeroedAndAligned) {
  for (int64_t experts : {int64_t{1}, int64_t{8}}) {  // 384 KiB and 3 MiB of bf16
    PackedExperts p = make_packed_experts(experts, 384, 512, DType::BF16, true);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p.data.raw()) % 64, 0u);
    const uint8_t* b = static_cast<const uint8_t*>(p.data.raw());
    size_t nonzero = 0;
    for (size_t i = 0; i < p.data.nbytes(); ++i) nonzero += b[i] != 0;
    EXPECT_EQ(nonzero, 0u) << p.data.nbytes() << " bytes";
  }
}

TEST(Pack, GatedFromSeparateTensorsEqualsStackedRowsForInt8) {
  const Tensor w = test::random_f32({40, 24}, 1.0f, 5);
  const auto [g, u] = split_rows(w.to(DType::BF16));
  PackedExperts a = make_packed_experts(1, 40, 24, DType::I8, true), b = make_packed_experts(1, 40, 24, DType::I8, true);
  pack_expert(a, 0, w.to(DType::BF16));
  pack_expert_gated(b, 0, g, u);
  EXPECT_EQ(std::memcmp(a.data.raw(), b.data.raw(), a.data.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.w_scale.raw(), b.w_scale.raw(), a.w_scale.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.w_comp.raw(), b.w_comp.raw(), a.w_comp.nbytes()), 0);
}

TEST(Pack, RejectsMismatchedSources) {
  PackedExperts p = make_packed_experts(2, 8, 4, DType::BF16, true);
  const Tensor g = test::random_f32({4, 4}, 1.0f, 1);
  EXPECT_THROW(pack_expert_gated(p, 0, g, g.to(DType::BF16)), Error);         // dtypes differ
  EXPECT_THROW(pack_expert_gated(p, 0, g, test::random_f32({4, 5}, 1.f, 2)), Error);  // shape
  EXPECT_THROW(pack_expert_gated(p, 2, g, g), Error);                          // expert range
  EXPECT_THROW(pack_expert(p, 0, Tensor::zeros({8, 4}, DType::I32)), Error);  // not a float dtype
  PackedExperts plain = make_packed_experts(1, 8, 4, DType::BF16, false);
  EXPECT_THROW(pack_expert_gated(plain, 0, g, g), Error);  // not gated
}

// The loader packs W13 from the separate gate/up views and W2 from the down view: its
// slots equal packing the checkpoint's stacked rows, per-expert and stacked layouts.
TEST(Pack, LoaderPacksTheCheckpointRows) {
  for (const char* name : {"qwen2_moe", "qwen2_moe_fused", "mixtral"}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << name << " " << dtype_name(dt));
      Checkpoint ck = Checkpoint::open(test::fixtures_dir() + "/" + name);
      const MoeConfig cfg = MoeConfig::from_hf(ck.config());
      MlpLoadOptions o;
      o.compute = dt;
      const MoeLayerWeights w = load_moe_layer(ck, cfg, 0, o);
      const MlpKeys keys = mlp_keys(cfg, 0, &ck);
      const int64_t I = cfg.moe_intermediate_size, H = cfg.hidden_size;
      const bool fused = ck.has(keys.fused_gate_up);
      for (int64_t e = 0; e < cfg.n_experts; ++e) {
        Tensor w13 = Tensor::empty({2 * I, H}, DType::F32), w2;
        if (fused) {
          w13 = ck.view(keys.fused_gate_up).slice_rows(e, e + 1).reshape({2 * I, H}).to(DType::F32);
          w2 = ck.view(keys.fused_down).slice_rows(e, e + 1).reshape({H, I}).to(DType::F32);
        } else {
          const Tensor g = ck.view(fmt::format(fmt::runtime(keys.expert_gate), e)).to(DType::F32);
          const Tensor u = ck.view(fmt::format(fmt::runtime(keys.expert_up), e)).to(DType::F32);
          std::memcpy(w13.data<float>(), g.raw(), g.nbytes());
          std::memcpy(w13.data<float>() + I * H, u.raw(), u.nbytes());
          w2 = ck.view(fmt::format(fmt::runtime(keys.expert_down), e)).to(DType::F32);
        }
        ASSERT_EQ(first_diff(w.w13, e, reference_slot(w13, true, dt)), -1) << "W13 of expert " << e;
        ASSERT_EQ(first_diff(w.w2, e, reference_slot(w2, false, dt)), -1) << "W2 of expert " << e;
      }
    }
  }
}

}  // namespace
}  // namespace moe
