// Runtime CPU feature detection.
//
// The binary is compiled for baseline x86-64 plus per-function AVX2/AVX-512
// targets (see kernels/*), so one build runs on any x86-64 and picks the best
// kernel at run time. MOE_ISA=portable|avx2|avx512|avx512bf16|amx (or --isa) forces a
// lower level; asking for a level this CPU lacks is an error (parse_isa_request),
// never a silent run at a lower one.
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
  // AMX-TILE and AMX-INT8, enabled by the OS (XCR0 tile state) and granted to this
  // process (Linux hands the 8 KiB tile state out only on request: arch_prctl
  // ARCH_REQ_XCOMP_PERM, made once at detection).
  bool amx_int8 = false;
  bool amx_bf16 = false;  // AMX-BF16 (CPUID.7.0 EDX bit 22), under the same OS conditions
};

// Amx: Avx512Bf16 plus AVX512_VNNI, AMX-INT8 and AMX-BF16 (every AMX CPU so far has both:
// Sapphire, Emerald and Granite Rapids). The int8-activation kernels run their prefill on
// tiles and their decode on VNNI; bf16 and FP8 weights run decode and prefill on tiles.
enum class Isa { Portable, Avx2, Avx512, Avx512Bf16, Amx };
inline constexpr Isa kTopIsa = Isa::Amx;  // the highest level there is (a cap that lifts every cap)

// What the CPU and OS support (cpuid + xgetbv), cached.
const CpuFeatures& cpu_features();
// The best ISA level usable now: detected features, capped by MOE_ISA or set_isa_cap().
Isa active_isa();
// The best level this CPU and OS support, ignoring caps.
Isa hardware_isa();
// Caps the ISA level; never raises it above what the CPU has (a cap above is clamped:
// tests set caps in a loop over every level, see tests/test_isa.h). A user's request
// goes through parse_isa_request first.
void set_isa_cap(Isa cap);
Isa parse_isa(const std::string& name);  // "portable", "avx2", "avx512", "avx512bf16", "amx" ("native": the top)
// A user's request for a level (`source` names where it came from: "--isa" or
// "MOE_ISA"): the level, or a clear error naming the missing features when this CPU
// does not have it, e.g. "--isa avx512bf16: this CPU has no AVX512F, ..., AVX512_BF16
// (it has: avx2 fma f16c; best level: avx2)". "native" is the best level of this CPU.
Isa parse_isa_request(const std::string& name, const std::string& source);
const char* isa_name(Isa isa);
std::string cpu_features_str();  // "avx2 fma avx512f ..." ("baseline x86-64" if none)
std::string cpu_summary();       // cpu_features_str() + " (active: avx512bf16)"

}  // namespace moe
