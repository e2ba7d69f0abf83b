// ISA caps for tests that run a kernel under every instruction-set level this CPU has.
#pragma once

#include <vector>

#include "core/cpu.h"

namespace moe::test {

// Sets an ISA cap for the scope, restores the previous active level on exit.
class IsaScope {
 public:
  explicit IsaScope(Isa cap) : prev_(active_isa()) { set_isa_cap(cap); }
  ~IsaScope() { set_isa_cap(prev_); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  Isa prev_;
};

// The ISA levels this CPU can run (a cap above the hardware is clamped, so skip those).
inline std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}) {
    IsaScope s(i);
    if (active_isa() == i) out.push_back(i);
  }
  return out;
}

}  // namespace moe::test
