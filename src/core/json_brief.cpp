#include "core/json_brief.h"

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace moe {

namespace {

// Depth 4 shows every value of a real config.json or safetensors header in full
// (they nest 3 levels: rope_parameters {..}, weight_block_size [..], shape [..]).
constexpr int kMaxDepth = 4;

// A scalar or a key, with invalid UTF-8 (a string cut mid-character) replaced, not thrown.
std::string scalar(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Appends j to out; stops (false) as soon as out is longer than `limit`.
bool render(const nlohmann::json& j, int depth, size_t limit, std::string& out) {
  if (j.is_array() || j.is_object()) {
    const bool arr = j.is_array();
    if (depth >= kMaxDepth && !j.empty()) {
      out += arr ? "[...]" : "{...}";
      return out.size() <= limit;
    }
    out += arr ? '[' : '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += ',';
      first = false;
      if (!arr) out += scalar(nlohmann::json(it.key().substr(0, limit + 1))) + ':';
      if (out.size() > limit || !render(*it, depth + 1, limit, out)) return false;
    }
    out += arr ? ']' : '}';
  } else if (j.is_string()) {
    // Cut before rendering, so a 100 MB string costs no more than a short one.
    out += scalar(nlohmann::json(j.get_ref<const std::string&>().substr(0, limit + 1)));
  } else {
    out += scalar(j);
  }
  return out.size() <= limit;
}

}  // namespace

std::string json_brief(const nlohmann::json& j, size_t max_chars) {
  std::string s;
  bool whole = false;
  try {
    whole = render(j, 0, max_chars, s);
  } catch (const std::exception&) {  // bad_alloc: the message matters less than the error it is for
  }
  if (!whole) s = s.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return s;
}

bool config_flag(const nlohmann::json& cfg, const char* key, bool dflt) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return dflt;
  MOE_CHECK(it->is_boolean(), "config.json: field '{}' is {}, expected true or false", key, json_brief(*it));
  return it->get<bool>();
}

}  // namespace moe
