// A short rendering of a (possibly hostile) JSON value for error messages, and the
// config.json boolean reader whose errors show one.
//
// nlohmann's dump() recurses once per nesting level and renders everything: a
// config.json field holding an array nested a million levels deep (a 2 MB file) would
// overflow the stack while we only wanted to say "expected an integer", and a huge
// array would be rendered whole to keep its first 80 characters.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace moe {

// At most about `max_chars` characters ("..." marks a cut); arrays and objects nested
// deeper than a few levels show as "[...]" / "{...}". Never throws.
std::string json_brief(const nlohmann::json& j, size_t max_chars = 80);

// config.json's boolean `key`: `dflt` when absent or null; anything else is an error
// naming the key and showing the value (json_brief).
bool config_flag(const nlohmann::json& cfg, const char* key, bool dflt);

}  // namespace moe
