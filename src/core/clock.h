#pragma once
// Wall time for stage timings and benchmarks: seconds on the steady clock (monotonic, so a
// clock change mid-run cannot make a stage negative).
#include <chrono>

namespace moe {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace moe
