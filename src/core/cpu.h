// Runtime CPU feature detection.
//
// The binary is compiled for baseline x86-64 plus per-function AVX2/AVX-512
// targets (see kernels/*), so one build runs on any x86-64 and picks the best
// kernel at run time. MOE_ISA=portable|avx2|avx512|avx512bf16 forces a lower
// level (tests use it to run every path on one machine).
#pragma once

#include <string>

namespace moe {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
};

enum class Isa { Portable, Avx2, Avx512, Avx512Bf16 };

// What the CPU and OS support (cpuid + xgetbv), cached.
const CpuFeatures& cpu_features();
// The best ISA level usable now: detected features, capped by MOE_ISA or set_isa_cap().
Isa active_isa();
// Caps the ISA level (for tests and `--isa`); never raises it above what the CPU has.
void set_isa_cap(Isa cap);
Isa parse_isa(const std::string& name);
const char* isa_name(Isa isa);
std::string cpu_summary();  // "avx2 fma avx512f ... (active: avx512bf16)"

}  // namespace moe
