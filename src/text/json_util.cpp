#include "text/json_util.h"

#include "text/unicode.h"

namespace moe::text::js {

char32_t single_char(const json& j, const char* key, const std::string& where) {
  const std::string s = str(j, key, where);
  MOE_CHECK(!s.empty() && uni::find_invalid_utf8(s) == std::string::npos, "{}: field '{}' must be one character",
            where, key);
  size_t i = 0;
  const char32_t c = uni::next_cp(s, i);
  MOE_CHECK(i == s.size(), "{}: field '{}' must be one character, got '{}'", where, key, s);
  return c;
}

}  // namespace moe::text::js
