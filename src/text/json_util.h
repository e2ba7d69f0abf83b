// Typed reads of tokenizer.json fields with errors that say which file, which component
// and which field was wrong ("qwen3/tokenizer.json: pre_tokenizer.pretokenizers[0]: field
// 'behavior' must be a string").
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/check.h"

namespace moe::text::js {

using json = nlohmann::json;

inline const json* find(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

inline const json& req(const json& j, const char* key, const std::string& where) {
  MOE_CHECK(j.is_object(), "{}: expected a JSON object", where);
  auto it = j.find(key);
  MOE_CHECK(it != j.end(), "{}: missing field '{}'", where, key);
  return *it;
}

inline std::string str(const json& j, const char* key, const std::string& where) {
  const json& v = req(j, key, where);
  MOE_CHECK(v.is_string(), "{}: field '{}' must be a string", where, key);
  return v.get<std::string>();
}

inline std::string str_or(const json& j, const char* key, const std::string& dflt, const std::string& where) {
  const json* v = find(j, key);
  if (!v || v->is_null()) return dflt;
  MOE_CHECK(v->is_string(), "{}: field '{}' must be a string", where, key);
  return v->get<std::string>();
}

inline bool boolean_or(const json& j, const char* key, bool dflt, const std::string& where) {
  const json* v = find(j, key);
  if (!v || v->is_null()) return dflt;
  MOE_CHECK(v->is_boolean(), "{}: field '{}' must be true or false", where, key);
  return v->get<bool>();
}

inline int64_t integer_or(const json& j, const char* key, int64_t dflt, const std::string& where) {
  const json* v = find(j, key);
  if (!v || v->is_null()) return dflt;
  MOE_CHECK(v->is_number_integer(), "{}: field '{}' must be an integer", where, key);
  return v->get<int64_t>();
}

inline const json& arr(const json& j, const char* key, const std::string& where) {
  const json& v = req(j, key, where);
  MOE_CHECK(v.is_array(), "{}: field '{}' must be a list", where, key);
  return v;
}

// A single Unicode character given as a string (Rust `char` fields such as
// Metaspace.replacement).
char32_t single_char(const json& j, const char* key, const std::string& where);

// The "type" of a component object.
inline std::string type_of(const json& j, const std::string& where) {
  MOE_CHECK(j.is_object(), "{}: expected a JSON object", where);
  return str(j, "type", where);
}

}  // namespace moe::text::js
