// Metadata values of a GGUF file: reading numbers out of the mapping, typed getters
// with range checks, and a readable rendering.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "loader/gguf/gguf_file.h"

namespace moe::gguf {

namespace {

uint64_t scalar_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

bool is_int(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
      return true;
    default:
      return false;
  }
}
bool is_float(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

// Little-endian bytes as an unsigned integer.
uint64_t load_le(const uint8_t* p, uint64_t n) {
  uint64_t v = 0;
  for (uint64_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// The type of a value as a message says it: "UINT32", "ARRAY of STRING".
std::string type_str(const Value& v) {
  if (!v.is_array()) return value_type_name(v.type);
  return "ARRAY of " + value_type_name(v.elem_type);
}

std::string int_str(__int128 x) {
  return x < 0 ? std::to_string(static_cast<int64_t>(x)) : std::to_string(static_cast<uint64_t>(x));
}

template <class T>
T fit_int(__int128 x, const std::string& path, const std::string& key, const std::string& what, const char* want) {
  MOE_CHECK(x >= static_cast<__int128>(std::numeric_limits<T>::min()) &&
                x <= static_cast<__int128>(std::numeric_limits<T>::max()),
            "gguf file '{}': key '{}'{} = {} does not fit in {} (range {} .. {})", path, key, what, int_str(x), want,
            int_str(std::numeric_limits<T>::min()), int_str(std::numeric_limits<T>::max()));
  return static_cast<T>(x);
}

float fit_f32(double x, const std::string& path, const std::string& key, const std::string& what) {
  MOE_CHECK(!std::isfinite(x) || std::fabs(x) <= static_cast<double>(std::numeric_limits<float>::max()),
            "gguf file '{}': key '{}'{} = {} does not fit in float32", path, key, what, x);
  return static_cast<float>(x);
}

template <class T>
std::optional<T> opt_int(const Metadata& m, const std::string& path, const std::string& key, const char* want) {
  const Value* v = m.find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(is_int(v->type), "gguf file '{}': key '{}' is {}, expected an integer ({})", path, key, type_str(*v),
            want);
  return fit_int<T>(v->int_at(), path, key, "", want);
}

template <class T>
T need(std::optional<T> v, const std::string& path, const std::string& key) {
  MOE_CHECK(v.has_value(), "gguf file '{}': key '{}' not found", path, key);
  return std::move(*v);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Value

__int128 Value::int_at(uint64_t i) const {
  const ValueType t = is_array() ? elem_type : type;
  MOE_CHECK(is_int(t) || t == ValueType::Bool, "internal: int_at on a {} value", type_str(*this));
  MOE_CHECK(is_array() ? i < count : i == 0, "internal: int_at({}) of {} elements", i, is_array() ? count : 1);
  const uint64_t n = scalar_bytes(t);
  const uint64_t u = load_le(raw + i * n, n);
  if (t == ValueType::Bool) return u != 0 ? 1 : 0;  // any non-zero byte is true, as in ggml
  if (!is_signed(t)) return static_cast<__int128>(u);
  const int shift = static_cast<int>(64 - 8 * n);
  return static_cast<__int128>(static_cast<int64_t>(u << shift) >> shift);  // sign-extend
}

double Value::float_at(uint64_t i) const {
  const ValueType t = is_array() ? elem_type : type;
  MOE_CHECK(is_float(t), "internal: float_at on a {} value", type_str(*this));
  MOE_CHECK(is_array() ? i < count : i == 0, "internal: float_at({}) of {} elements", i, is_array() ? count : 1);
  if (t == ValueType::F32) {
    const auto u = static_cast<uint32_t>(load_le(raw + i * 4, 4));
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint64_t u = load_le(raw + i * 8, 8);
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

std::string format_value(const Value& v, size_t max_items) {
  auto scalar = [](const Value& a, ValueType t, uint64_t i) -> std::string {
    if (t == ValueType::Bool) return a.int_at(i) ? "true" : "false";
    if (is_float(t)) return fmt::format("{}", a.float_at(i));
    return int_str(a.int_at(i));
  };
  if (v.type == ValueType::String) return fmt::format("\"{}\"", v.str);
  if (!v.is_array()) return scalar(v, v.type, 0);
  std::string s = "[";
  const uint64_t shown = std::min<uint64_t>(v.count, max_items);
  for (uint64_t i = 0; i < shown; ++i) {
    if (i) s += ", ";
    if (v.elem_type == ValueType::String) s += fmt::format("\"{}\"", v.strings[i]);
    else if (v.elem_type == ValueType::Array) s += format_value(v.items[i], max_items);
    else s += scalar(v, v.elem_type, i);
  }
  if (shown < v.count) s += fmt::format(", ... ({} total)", v.count);
  return s + "]";
}

// ---------------------------------------------------------------------------------------
// Metadata

const Value* Metadata::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

std::optional<uint32_t> Metadata::opt_u32(const std::string& key) const {
  return opt_int<uint32_t>(*this, path_, key, "uint32");
}
std::optional<uint64_t> Metadata::opt_u64(const std::string& key) const {
  return opt_int<uint64_t>(*this, path_, key, "uint64");
}
std::optional<int32_t> Metadata::opt_i32(const std::string& key) const {
  return opt_int<int32_t>(*this, path_, key, "int32");
}
std::optional<int64_t> Metadata::opt_i64(const std::string& key) const {
  return opt_int<int64_t>(*this, path_, key, "int64");
}

std::optional<float> Metadata::opt_f32(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(is_float(v->type), "gguf file '{}': key '{}' is {}, expected a float (FLOAT32 or FLOAT64)", path_, key,
            type_str(*v));
  return fit_f32(v->float_at(), path_, key, "");
}

std::optional<bool> Metadata::opt_bool(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(v->type == ValueType::Bool, "gguf file '{}': key '{}' is {}, expected BOOL", path_, key, type_str(*v));
  return v->int_at() != 0;
}

std::optional<std::string> Metadata::opt_str(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(v->type == ValueType::String, "gguf file '{}': key '{}' is {}, expected STRING", path_, key,
            type_str(*v));
  return std::string(v->str);
}

std::optional<std::vector<std::string>> Metadata::opt_str_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(v->is_array() && v->elem_type == ValueType::String, "gguf file '{}': key '{}' is {}, expected ARRAY of "
            "STRING", path_, key, type_str(*v));
  return std::vector<std::string>(v->strings.begin(), v->strings.end());
}

std::optional<std::vector<int32_t>> Metadata::opt_i32_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(v->is_array() && is_int(v->elem_type), "gguf file '{}': key '{}' is {}, expected an ARRAY of integers "
            "(int32)", path_, key, type_str(*v));
  std::vector<int32_t> out;
  out.reserve(v->count);
  for (uint64_t i = 0; i < v->count; ++i)
    out.push_back(fit_int<int32_t>(v->int_at(i), path_, key, fmt::format("[{}]", i), "int32"));
  return out;
}

std::optional<std::vector<float>> Metadata::opt_f32_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  MOE_CHECK(v->is_array() && is_float(v->elem_type), "gguf file '{}': key '{}' is {}, expected an ARRAY of floats "
            "(FLOAT32 or FLOAT64)", path_, key, type_str(*v));
  std::vector<float> out;
  out.reserve(v->count);
  for (uint64_t i = 0; i < v->count; ++i) out.push_back(fit_f32(v->float_at(i), path_, key, fmt::format("[{}]", i)));
  return out;
}

uint32_t Metadata::get_u32(const std::string& key) const { return need(opt_u32(key), path_, key); }
uint64_t Metadata::get_u64(const std::string& key) const { return need(opt_u64(key), path_, key); }
int32_t Metadata::get_i32(const std::string& key) const { return need(opt_i32(key), path_, key); }
int64_t Metadata::get_i64(const std::string& key) const { return need(opt_i64(key), path_, key); }
float Metadata::get_f32(const std::string& key) const { return need(opt_f32(key), path_, key); }
bool Metadata::get_bool(const std::string& key) const { return need(opt_bool(key), path_, key); }
std::string Metadata::get_str(const std::string& key) const { return need(opt_str(key), path_, key); }
std::vector<std::string> Metadata::get_str_array(const std::string& key) const {
  return need(opt_str_array(key), path_, key);
}
std::vector<int32_t> Metadata::get_i32_array(const std::string& key) const {
  return need(opt_i32_array(key), path_, key);
}
std::vector<float> Metadata::get_f32_array(const std::string& key) const {
  return need(opt_f32_array(key), path_, key);
}

}  // namespace moe::gguf
