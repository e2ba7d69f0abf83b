#include "core/check.h"

#include <cstring>

namespace moe {

void throw_error(const char* file, int line, const std::string& msg) {
  // Keep only the path below src/ so messages do not leak the build machine's layout.
  const char* rel = std::strstr(file, "src/");
  throw Error(fmt::format("{}:{}: {}", rel ? rel : file, line, msg));
}

}  // namespace moe
