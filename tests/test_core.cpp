// Core: dtype conversions (checked against IEEE bit patterns, not our own output),
// tensor views and alignment, errors with file:line, the ISA cap.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "test_util.h"

namespace moe {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  // 1 + 2^-8 is halfway between bf16 1.0 (0x3f80) and 1 + 2^-7 (0x3f81): ties to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 0x3f81 and 0x3f82: ties to even (0x3f82).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // The largest finite f32 overflows to infinity, as IEEE rounding says.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bits(bf16_to_f32(0x4049)), 0x40490000u);  // 3.140625
}

TEST(DType, F16RoundTripsEveryValue) {
  int checked = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "f16 0x" << std::hex << h;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);  // every non-NaN pattern
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);                // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                // rounds to infinity
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // halfway: ties to even
}

TEST(DType, NamesAndErrors) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("f32"), DType::F32);
  try {
    parse_dtype("f64x");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("f64x"), std::string::npos);
    EXPECT_NE(m.find("src/core/dtype.cpp:"), std::string::npos) << "errors carry file:line: " << m;
  }
}

TEST(Tensor, AlignedStorageViewsAndConversion) {
  Tensor t = Tensor::zeros({5, 3}, DType::F32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % kTensorAlign, 0u);
  for (int i = 0; i < 15; ++i) t.data<float>()[i] = static_cast<float>(i);
  const Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.data<float>()[0], 3.0f);
  EXPECT_EQ(rows.reshape({6}).data<float>()[5], 8.0f);
  const Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to(DType::F32).data<float>()[14], 14.0f);
  EXPECT_THROW(t.reshape({4, 4}), Error);
  EXPECT_THROW(t.slice_rows(2, 6), Error);
  EXPECT_THROW(t.data<uint16_t>(), Error);  // an f32 tensor read as 2-byte elements
  EXPECT_THROW(Tensor::empty({2, -1}, DType::F32), Error);
  const Tensor empty = Tensor::empty({0, 7}, DType::BF16);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.defined());
}

TEST(Cpu, IsaCapNeverRaisesAboveTheHardware) {
  const Isa hw = active_isa();
  set_isa_cap(Isa::Portable);
  EXPECT_EQ(active_isa(), Isa::Portable);
  set_isa_cap(kTopIsa);
  EXPECT_EQ(active_isa(), hw);
  EXPECT_THROW(parse_isa("sse9"), Error);
  EXPECT_FALSE(cpu_summary().empty());
}

// A user's request (--isa, MOE_ISA) above the CPU fails and names what is missing;
// within the CPU it is the level asked for.
TEST(Cpu, IsaRequestAboveTheHardwareFails) {
  const Isa hw = hardware_isa();
  EXPECT_EQ(parse_isa_request("native", "--isa"), hw);
  for (Isa want : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}) {
    const std::string name = isa_name(want);
    if (want <= hw) {
      EXPECT_EQ(parse_isa_request(name, "--isa"), want);
      continue;
    }
    try {
      parse_isa_request(name, "--isa");
      ADD_FAILURE() << "--isa " << name << " accepted on a CPU whose best level is " << isa_name(hw);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--isa " + name + ": this CPU has no "), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("best level: ") + isa_name(hw)), std::string::npos) << m;
      if (want == Isa::Avx512Bf16) {
        EXPECT_NE(m.find("AVX512_BF16"), std::string::npos) << m;
      }
      if (want == Isa::Amx) {
        EXPECT_NE(m.find("AMX-INT8"), std::string::npos) << m;
      }
    }
    try {
      parse_isa_request(name, "MOE_ISA");
      ADD_FAILURE() << "MOE_ISA=" << name << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MOE_ISA=" + name + ":"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_isa_request("sse9", "--isa"), Error);
}

TEST(AtomicFile, ReplacesWholeAndLeavesNoTempFile) {
  test::TempDir tmp;
  const std::string path = tmp / "out.json";
  write_file_atomic(path, "first\n", "--output-json");
  write_file_atomic(path, "second, longer\n", "--output-json");
  std::ifstream in(path);
  const std::string got((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(got, "second, longer\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(AtomicFile, FailureNamesTheFlagAndLeavesNothing) {
  test::TempDir tmp;
  const std::string path = tmp / "no_such_dir/out.json";
  try {
    write_file_atomic(path, "x", "--output-json");
    FAIL() << "writing into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--output-json " + path + ": cannot create"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  // A directory where the file should go: the rename fails, the temp file is removed.
  const std::string dir_path = tmp / "is_a_dir";
  std::filesystem::create_directory(dir_path);
  EXPECT_THROW(write_file_atomic(dir_path, "x", "--json"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir_path + ".tmp"));
}

}  // namespace
}  // namespace moe
