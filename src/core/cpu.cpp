#include "core/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "core/check.h"

namespace moe {

namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM and YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = os_avx && (b & (1u << 5));
  if (os_avx512) {
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512_vnni = c & (1u << 11);
    unsigned a1, b1, c1, d1;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) f.avx512_bf16 = a1 & (1u << 5);
    // AMX: CPUID.7.0 EDX bit 24 (AMX-TILE), 25 (AMX-INT8) and 22 (AMX-BF16); XCR0 bits 17-18 (tile
    // config and data) set by an OS that manages the state; then Linux's permission for
    // XTILEDATA (feature 18), which is refused on kernels before 5.16.
    const bool cpu_amx = (d & (1u << 24)) && (d & (1u << 25));
    const bool os_amx = (xcr0 & (uint64_t(3) << 17)) == (uint64_t(3) << 17);
#ifdef SYS_arch_prctl
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_int8 = cpu_amx && os_amx && ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    f.amx_bf16 = f.amx_int8 && (d & (1u << 22));
#else
    (void)cpu_amx;
    (void)os_amx;
#endif
  }
  if (!os_avx) f.fma = f.f16c = false;
  return f;
}

Isa detect_isa() {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma;
  if (avx512 && f.avx512_bf16 && f.avx512_vnni && f.amx_int8 && f.amx_bf16) return Isa::Amx;
  if (avx512 && f.avx512_bf16) return Isa::Avx512Bf16;
  if (avx512) return Isa::Avx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::Avx2;
  return Isa::Portable;
}

// MOE_ISA is a user's request like --isa: a level above the CPU is an error. The CLI
// calls active_isa() before any work, so the error comes at start-up.
Isa env_cap() {
  const char* e = std::getenv("MOE_ISA");
  return e && *e ? parse_isa_request(e, "MOE_ISA") : kTopIsa;
}

// Upper-case names of the features `want` needs that this CPU lacks.
std::string missing_features(Isa want) {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto need = [&](bool on, const char* name) {
    if (!on) s += std::string(s.empty() ? "" : ", ") + name;
  };
  if (want >= Isa::Avx2) {
    need(f.avx2, "AVX2");
    need(f.fma, "FMA");
    need(f.f16c, "F16C");
  }
  if (want >= Isa::Avx512) {
    need(f.avx512f, "AVX512F");
    need(f.avx512bw, "AVX512BW");
    need(f.avx512vl, "AVX512VL");
    need(f.avx512dq, "AVX512DQ");
  }
  if (want >= Isa::Avx512Bf16) need(f.avx512_bf16, "AVX512_BF16");
  if (want >= Isa::Amx) {
    need(f.avx512_vnni, "AVX512_VNNI");
    need(f.amx_int8, "AMX-INT8 (with the OS's permission for tile data)");
    need(f.amx_bf16, "AMX-BF16");
  }
  return s;
}

std::atomic<int> g_cap{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa hardware_isa() {
  static const Isa hw = detect_isa();
  return hw;
}

Isa parse_isa(const std::string& s) {
  if (s == "portable") return Isa::Portable;
  if (s == "avx2") return Isa::Avx2;
  if (s == "avx512") return Isa::Avx512;
  if (s == "avx512bf16") return Isa::Avx512Bf16;
  if (s == "amx" || s == "native") return Isa::Amx;
  MOE_FAIL("unknown ISA '{}': expected portable, avx2, avx512, avx512bf16 or amx", s);
}

Isa parse_isa_request(const std::string& name, const std::string& source) {
  const Isa hw = hardware_isa();
  if (name == "native") return hw;
  const Isa want = parse_isa(name);
  MOE_CHECK(want <= hw, "{}{}{}: this CPU has no {} (it has: {}; best level: {})", source,
            source.rfind("--", 0) == 0 ? " " : "=", name, missing_features(want), cpu_features_str(), isa_name(hw));
  return want;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Portable: return "portable";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512bf16";
    case Isa::Amx: return "amx";
  }
  return "?";
}

void set_isa_cap(Isa cap) { g_cap.store(static_cast<int>(cap)); }

Isa active_isa() {
  int cap = g_cap.load();
  if (cap < 0) {
    static const Isa from_env = env_cap();
    cap = static_cast<int>(from_env);
  }
  return static_cast<Isa>(std::min(cap, static_cast<int>(hardware_isa())));
}

std::string cpu_features_str() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += std::string(s.empty() ? "" : " ") + name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.amx_int8, "amx_int8");
  add(f.amx_bf16, "amx_bf16");
  return s.empty() ? std::string("baseline x86-64") : s;
}

std::string cpu_summary() { return cpu_features_str() + " (active: " + isa_name(active_isa()) + ")"; }

}  // namespace moe
