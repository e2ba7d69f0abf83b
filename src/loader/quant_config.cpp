#include "loader/quant_config.h"

#include "core/check.h"

namespace moe {

namespace {

// A string list field: absent or null gives nothing; anything else must be strings.
void read_list(const nlohmann::json& q, const char* field, std::vector<std::string>& out) {
  if (!q.contains(field) || q[field].is_null()) return;
  const auto& v = q[field];
  MOE_CHECK(v.is_array(), "config.json: quantization_config.{} must be a list of module names, got {}", field,
            v.dump());
  for (const auto& s : v) {
    MOE_CHECK(s.is_string(), "config.json: quantization_config.{} must hold module names (strings), got {}", field,
              s.dump());
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
}

}  // namespace

bool QuantConfig::ignores(const std::string& module) const {
  const std::string m = "." + module + ".";
  for (const std::string& e : not_converted)
    if (m.find("." + e + ".") != std::string::npos) return true;
  return false;
}

std::string module_of(const std::string& key) {
  for (const char* tail : {".weight", ".bias"})
    if (key.ends_with(tail)) return key.substr(0, key.size() - std::char_traits<char>::length(tail));
  return key;
}

QuantConfig parse_quant_config(const nlohmann::json& config) {
  QuantConfig c;
  if (!config.is_object() || !config.contains("quantization_config") || config["quantization_config"].is_null())
    return c;
  const auto& q = config["quantization_config"];
  MOE_CHECK(q.is_object(), "config.json: quantization_config must be an object, got {}", q.dump());
  MOE_CHECK(q.contains("quant_method") && q["quant_method"].is_string(),
            "config.json: quantization_config has no quant_method string (expected \"fp8\")");
  c.method_name = q["quant_method"].get<std::string>();
  MOE_CHECK(c.method_name == "fp8",
            "config.json: quantization_config.quant_method \"{}\" is not supported (moe-ep reads \"fp8\": e4m3 "
            "weights with block scales, as DeepSeek-V3 and Qwen3-FP8 publish them; int8 W8A8 checkpoints need no "
            "quantization_config)",
            c.method_name);
  c.method = QuantConfig::Method::Fp8;
  if (q.contains("fmt") && !q["fmt"].is_null()) {
    MOE_CHECK(q["fmt"].is_string() && q["fmt"].get<std::string>() == "e4m3",
              "config.json: quantization_config.fmt {} is not supported (expected \"e4m3\")", q["fmt"].dump());
  }
  if (q.contains("activation_scheme") && !q["activation_scheme"].is_null()) {
    MOE_CHECK(q["activation_scheme"].is_string() && q["activation_scheme"].get<std::string>() == "dynamic",
              "config.json: quantization_config.activation_scheme {} is not supported (expected \"dynamic\": moe-ep "
              "computes FP8 layers with bf16 activations and has no static FP8 input scales)",
              q["activation_scheme"].dump());
  }
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const auto& b = q["weight_block_size"];
    MOE_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(),
              "config.json: quantization_config.weight_block_size must be [rows, cols], got {}", b.dump());
    c.block_n = b[0].get<int64_t>();
    c.block_k = b[1].get<int64_t>();
    // 2^20: far above any published block (128) and small enough that block arithmetic
    // on int64 shapes cannot overflow.
    MOE_CHECK(c.block_n > 0 && c.block_k > 0 && c.block_n <= (1 << 20) && c.block_k <= (1 << 20),
              "config.json: quantization_config.weight_block_size must be positive (and at most 2^20), got {}",
              b.dump());
  }
  read_list(q, "modules_to_not_convert", c.not_converted);
  read_list(q, "ignored_layers", c.not_converted);
  return c;
}

}  // namespace moe
