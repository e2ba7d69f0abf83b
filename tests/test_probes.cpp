// The machine-limit probes (kernels/probes.h): every dtype's kernel has a peak probe
// that runs on every ISA level this CPU has and measures > 0, the probe matches the
// instructions the kernel runs, and the AVX2 FMA peak relates to the SSE one as the
// register widths and FMA say it must.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/probes.h"
#include "test_isa.h"

namespace moe {
namespace {

using test::IsaScope;

TEST(Probes, EveryKernelPeakIsPositiveOnEveryIsa) {
  for (Isa isa : test::available_isas()) {
    IsaScope s(isa);
    for (auto [dt, coded] : {std::pair{DType::F32, false}, {DType::BF16, false}, {DType::F8E4M3, false},
                             {DType::I8, false}, {DType::I8, true}}) {
      const PeakProbe p = kernel_peak_probe(dt, coded);
      EXPECT_TRUE(peak_probe_available(p)) << isa_name(isa) << " " << dtype_name(dt);
      const double v = measure_peak(p, 1);
      std::printf("[ probes ] %-10s %-6s %-18s %8.1f %s\n", isa_name(isa), dtype_name(dt), peak_probe_name(p), v,
                  peak_probe_unit(p));
      EXPECT_GT(v, 0) << peak_probe_name(p);
    }
    EXPECT_GT(measure_read_bandwidth_gbs(size_t(64) << 20, 1), 0) << isa_name(isa);
  }
}

TEST(Probes, ProbeIsTheKernelsInstructions) {
  {
    IsaScope s(Isa::Portable);
    EXPECT_EQ(kernel_peak_probe(DType::F32), PeakProbe::F32Sse);
    EXPECT_EQ(kernel_peak_probe(DType::BF16), PeakProbe::F32Sse);
    EXPECT_EQ(kernel_peak_probe(DType::I8), PeakProbe::I32Scalar);
    EXPECT_STREQ(read_probe_loads(), "16-byte");
  }
  if (hardware_isa() >= Isa::Avx2) {
    IsaScope s(Isa::Avx2);
    EXPECT_EQ(kernel_peak_probe(DType::F32), PeakProbe::F32Avx2Fma);
    EXPECT_EQ(kernel_peak_probe(DType::BF16), PeakProbe::F32Avx2Fma);    // widened to f32, FMA
    EXPECT_EQ(kernel_peak_probe(DType::F8E4M3), PeakProbe::F32Avx2Fma);  // dequantised to bf16
    EXPECT_EQ(kernel_peak_probe(DType::I8), PeakProbe::I8Avx2Madd);
    EXPECT_STREQ(peak_probe_name(PeakProbe::F32Avx2Fma), "avx2-fma-f32");
    EXPECT_STREQ(peak_probe_unit(PeakProbe::I8Avx2Madd), "GOP/s");
    EXPECT_STREQ(read_probe_loads(), "ymm");
  }
  if (hardware_isa() >= Isa::Avx512) {
    IsaScope s(Isa::Avx512);
    EXPECT_EQ(kernel_peak_probe(DType::BF16), PeakProbe::F32Avx512Fma);  // no BF16: emulated
    EXPECT_EQ(kernel_peak_probe(DType::I8),
              cpu_features().avx512_vnni ? PeakProbe::I8Avx512Vnni : PeakProbe::I8Avx2Madd);
  }
  if (hardware_isa() >= Isa::Avx512Bf16) {
    IsaScope s(Isa::Avx512Bf16);
    EXPECT_EQ(kernel_peak_probe(DType::BF16), PeakProbe::Bf16Avx512Dp);
    EXPECT_EQ(kernel_peak_probe(DType::I8, true), PeakProbe::I8Avx512Vnni);  // group-coded: VNNI below amx
  }
  if (hardware_isa() >= Isa::Amx) {
    IsaScope s(Isa::Amx);
    EXPECT_EQ(kernel_peak_probe(DType::BF16), PeakProbe::Bf16AmxTile);    // decode and prefill on tiles
    EXPECT_EQ(kernel_peak_probe(DType::F8E4M3), PeakProbe::Bf16AmxTile);  // dequantised to bf16 tiles
    EXPECT_EQ(kernel_peak_probe(DType::I8), PeakProbe::I8Avx512Vnni);     // W8A8 stays on VNNI
    EXPECT_EQ(kernel_peak_probe(DType::I8, true), PeakProbe::I8AmxTile);  // group-coded prefill on tiles
    EXPECT_STREQ(peak_probe_unit(PeakProbe::I8AmxTile), "GOP/s");
    EXPECT_STREQ(peak_probe_unit(PeakProbe::Bf16AmxTile), "GFLOP/s");
    // A tile product does 16 x 16 x 32 bf16 multiply-adds in the time vdpbf16ps does 16 x 2:
    // its peak is several times vdpbf16ps' (Sapphire Rapids: 1024 against 64 flops per cycle).
    EXPECT_GT(measure_peak(PeakProbe::Bf16AmxTile, 1), 2 * measure_peak(PeakProbe::Bf16Avx512Dp, 1));
  }
  EXPECT_THROW(kernel_peak_probe(DType::I64), Error);
}

TEST(Probes, UnavailableProbeFailsInsteadOfZero) {
  IsaScope s(Isa::Portable);
  for (PeakProbe p : {PeakProbe::F32Avx2Fma, PeakProbe::I8Avx2Madd, PeakProbe::F32Avx512Fma, PeakProbe::Bf16Avx512Dp,
                      PeakProbe::I8Avx512Vnni, PeakProbe::Bf16AmxTile, PeakProbe::I8AmxTile}) {
    EXPECT_FALSE(peak_probe_available(p)) << peak_probe_name(p);
    EXPECT_THROW(measure_peak(p, 1), Error) << peak_probe_name(p);
  }
}

}  // namespace
}  // namespace moe
