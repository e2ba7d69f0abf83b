// FUZZ_ASSERT(cond): a promise a fuzz target checks. A broken one prints the condition
// and where it is (the file names the target), then traps, so libFuzzer records the
// input as a crash and the finding says which promise broke.
#pragma once

#include <cstdio>

#define FUZZ_ASSERT(cond)                                                                            \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      std::fprintf(stderr, "%s:%d: broken promise: %s\n", __FILE__, __LINE__, #cond);               \
      __builtin_trap();                                                                              \
    }                                                                                                \
  } while (0)
