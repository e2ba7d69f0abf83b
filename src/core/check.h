// Errors and assertions.
//
// MOE_CHECK is for conditions a user can cause (bad file, bad flag, bad shape):
// it throws moe::Error whose message carries file:line and what was expected.
// MOE_DCHECK is for internal invariants: compiled out in Release builds.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

}  // namespace moe

// MOE_CHECK(cond, "fmt {}", args...) : throws moe::Error("file:line: message").
#define MOE_CHECK(cond, ...)                                              \
  do {                                                                    \
    if (!(cond)) [[unlikely]]                                             \
      ::moe::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define MOE_FAIL(...) ::moe::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#ifdef NDEBUG
#define MOE_DCHECK(cond) \
  do {                   \
  } while (0)
#else
#define MOE_DCHECK(cond) MOE_CHECK(cond, "internal invariant failed: {}", #cond)
#endif
