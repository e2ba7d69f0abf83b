#include "loader/quant_config.h"

#include <fmt/format.h>

#include <re2/re2.h>

#include "core/check.h"
#include "core/json_brief.h"

namespace moe {

namespace {

// A compressed-tensors "re:<regex>" entry, compiled once. The entries come from a file a user
// downloaded, so the engine must not be one that backtracks: std::regex (and Python's re)
// take exponential time on "(a*)*b" against a run of a's and recurse once per character.
// RE2 matches in time linear in the name and bounds the compiled program's memory; its
// syntax is Python's for everything real checkpoints write (".*lm_head", "re:.*mlp\\.gate$",
// classes, alternation, (?i)), and it refuses backreferences and lookaround, which it cannot
// run in linear time, at parse time with its own message.
std::shared_ptr<const re2::RE2> compile_module_regex(const char* field, const std::string& e) {
  RE2::Options opts;
  opts.set_log_errors(false);
  // 256 KiB per pattern (program and match caches): the entries real configs write take a
  // few KiB; a pattern of nested counted repeats that needs more is refused instead of built.
  opts.set_max_mem(int64_t{256} << 10);
  auto re = std::make_shared<const re2::RE2>(e.substr(3), opts);
  MOE_CHECK(re->ok(), "config.json: quantization_config.{} entry {} is not a regex moe-ep can run: {} (RE2 syntax: "
            "Python's, without backreferences or lookaround)",
            field, json_brief(nlohmann::json(e)), re->error());
  return re;
}

constexpr size_t kMaxModuleRegexes = 1024;

// A string list field: absent or null gives nothing; anything else must be strings.
void read_list(const nlohmann::json& q, const char* field, QuantConfig& c) {
  if (!q.contains(field) || q[field].is_null()) return;
  const auto& v = q[field];
  MOE_CHECK(v.is_array(), "config.json: quantization_config.{} must be a list of module names, got {}", field,
            json_brief(v));
  for (const auto& s : v) {
    MOE_CHECK(s.is_string(), "config.json: quantization_config.{} must hold module names (strings), got {}", field,
              json_brief(s));
    const std::string e = s.get<std::string>();
    if (e.starts_with("re:")) {
      // Real configs carry a handful; the cap bounds what a hostile list can make us hold
      // (kMaxModuleRegexes x 256 KiB).
      MOE_CHECK(c.not_converted_re.size() < kMaxModuleRegexes,
                "config.json: quantization_config lists more than {} \"re:\" module patterns", kMaxModuleRegexes);
      c.not_converted_re.push_back(compile_module_regex(field, e));
    }
    if (!e.empty()) c.not_converted.push_back(e);
  }
}

// An optional integer / boolean / string field of `q` ("<where>.<field>" in messages).
int64_t read_int(const nlohmann::json& q, const std::string& where, const char* field, int64_t dflt) {
  if (!q.contains(field) || q[field].is_null()) return dflt;
  MOE_CHECK(q[field].is_number_integer(), "config.json: {}.{} must be an integer, got {}", where, field,
            json_brief(q[field]));
  return q[field].get<int64_t>();
}
bool read_bool(const nlohmann::json& q, const std::string& where, const char* field, bool dflt) {
  if (!q.contains(field) || q[field].is_null()) return dflt;
  MOE_CHECK(q[field].is_boolean(), "config.json: {}.{} must be true or false, got {}", where, field,
            json_brief(q[field]));
  return q[field].get<bool>();
}
std::string read_str(const nlohmann::json& q, const std::string& where, const char* field, const std::string& dflt) {
  if (!q.contains(field) || q[field].is_null()) return dflt;
  MOE_CHECK(q[field].is_string(), "config.json: {}.{} must be a string, got {}", where, field, json_brief(q[field]));
  return q[field].get<std::string>();
}

// The int4 kernels' groups hold any group size that 32 divides (a group of 256 is two
// kernel groups with the same scale); -1 is one group per output channel.
void check_group_size(const std::string& where, int64_t g) {
  MOE_CHECK(g == -1 || (g > 0 && g % 32 == 0 && g <= (1 << 20)),
            "config.json: {}.group_size {} is not supported (moe-ep's int4 kernels need a multiple of 32, e.g. 32, "
            "64 or 128, or -1 for one group per output channel)",
            where, g);
}

void parse_gptq_awq(const nlohmann::json& q, QuantConfig& c) {
  const std::string w = "quantization_config";
  const int64_t bits = read_int(q, w, "bits", -1);
  MOE_CHECK(bits == 4, "config.json: quantization_config.bits {} is not supported for quant_method \"{}\" "
            "(moe-ep reads 4-bit GPTQ and AWQ)", bits, c.method_name);
  c.group_size = read_int(q, w, "group_size", -2);
  MOE_CHECK(c.group_size != -2, "config.json: quantization_config.group_size missing (quant_method \"{}\")",
            c.method_name);
  check_group_size(w, c.group_size);
  if (c.method == QuantConfig::Method::Gptq) {
    c.sym = read_bool(q, w, "sym", true);
    c.desc_act = read_bool(q, w, "desc_act", false);
    const std::string fmt = read_str(q, w, "checkpoint_format", "gptq");
    MOE_CHECK(fmt == "gptq" || fmt == "gptq_v2",
              "config.json: quantization_config.checkpoint_format \"{}\" is not supported (expected \"gptq\" or "
              "\"gptq_v2\": the Marlin, BitBLAS and QQQ repackings are not read)",
              fmt);
    c.gptq_v1 = fmt == "gptq";
  } else {
    const std::string version = read_str(q, w, "version", "gemm");
    MOE_CHECK(version == "gemm" || version == "GEMM",
              "config.json: quantization_config.version \"{}\" is not supported (moe-ep reads AWQ's \"gemm\" "
              "packing; GEMV, Marlin and ExLlama repackings are not read)",
              version);
    MOE_CHECK(read_bool(q, w, "zero_point", true),
              "config.json: quantization_config.zero_point false is not supported for AWQ (expected true: qzeros "
              "with the GEMM packing)");
    c.sym = false;
  }
}

void parse_compressed_tensors(const nlohmann::json& q, QuantConfig& c) {
  const std::string format = read_str(q, "quantization_config", "format", "");
  MOE_CHECK(format == "pack-quantized",
            "config.json: quantization_config.format \"{}\" is not supported for compressed-tensors (moe-ep reads "
            "\"pack-quantized\" int4 weights, W4A16)",
            format);
  MOE_CHECK(q.contains("config_groups") && q["config_groups"].is_object() && !q["config_groups"].empty(),
            "config.json: quantization_config.config_groups must be a non-empty object, got {}",
            q.contains("config_groups") ? json_brief(q["config_groups"]) : std::string("nothing"));
  bool first = true;
  for (const auto& [name, grp] : q["config_groups"].items()) {
    const std::string where = "quantization_config.config_groups." + name;
    MOE_CHECK(grp.is_object(), "config.json: {} must be an object, got {}", where, json_brief(grp));
    const std::string gfmt = read_str(grp, where, "format", format);
    MOE_CHECK(gfmt == "pack-quantized", "config.json: {}.format \"{}\" is not supported (expected "
              "\"pack-quantized\")", where, gfmt);
    for (const char* act : {"input_activations", "output_activations"})
      MOE_CHECK(!grp.contains(act) || grp[act].is_null(),
                "config.json: {}.{} is set ({}): moe-ep reads weight-only W4A16 compressed-tensors (int4 weights, "
                "no activation quantisation scheme)", where, act, json_brief(grp[act]));
    MOE_CHECK(grp.contains("weights") && grp["weights"].is_object(), "config.json: {}.weights must be an object",
              where);
    const auto& wt = grp["weights"];
    const std::string ww = where + ".weights";
    MOE_CHECK(read_int(wt, ww, "num_bits", -1) == 4, "config.json: {}.num_bits {} is not supported (expected 4)",
              ww, read_int(wt, ww, "num_bits", -1));
    MOE_CHECK(read_str(wt, ww, "type", "int") == "int", "config.json: {}.type \"{}\" is not supported (expected "
              "\"int\")", ww, read_str(wt, ww, "type", "int"));
    MOE_CHECK(!read_bool(wt, ww, "dynamic", false), "config.json: {}.dynamic true is not supported (expected "
              "static weight scales)", ww);
    const std::string strategy = read_str(wt, ww, "strategy", "");
    int64_t gs = 0;
    if (strategy == "group") {
      gs = read_int(wt, ww, "group_size", -2);
      MOE_CHECK(gs > 0, "config.json: {}.group_size must be positive for strategy \"group\", got {}", ww, gs);
      check_group_size(ww, gs);
    } else {
      MOE_CHECK(strategy == "channel", "config.json: {}.strategy \"{}\" is not supported (expected \"group\" "
                "or \"channel\")", ww, strategy);
      gs = -1;
    }
    const bool sym = read_bool(wt, ww, "symmetric", true);
    const std::string actorder = wt.contains("actorder") && wt["actorder"].is_boolean()
                                     ? (wt["actorder"].get<bool>() ? "group" : "")
                                     : read_str(wt, ww, "actorder", "");
    MOE_CHECK(actorder.empty() || actorder == "static" || actorder == "group" || actorder == "weight",
              "config.json: {}.actorder \"{}\" is not supported", ww, actorder);
    if (first) {
      c.group_size = gs;
      c.sym = sym;
      c.desc_act = actorder == "group";  // "weight": columns reordered at quantisation, groups in order
      first = false;
    } else {
      MOE_CHECK(c.group_size == gs && c.sym == sym,
                "config.json: {} quantises weights differently from the first config group (group_size {} vs {}, "
                "symmetric {} vs {}): moe-ep reads one int4 scheme per checkpoint",
                where, gs, c.group_size, sym, c.sym);
    }
  }
}

}  // namespace

bool QuantConfig::ignores(const std::string& module) const {
  const std::string m = "." + module + ".";
  for (const std::string& e : not_converted)
    if (!e.starts_with("re:") && m.find("." + e + ".") != std::string::npos) return true;
  // compressed-tensors matches its "re:" entries with Python's re.match: anchored at the
  // start of the module name, not at its end ("re:model.layers.0" holds for the whole layer).
  for (const auto& re : not_converted_re)
    if (re->Match(module, 0, module.size(), RE2::ANCHOR_START, nullptr, 0)) return true;
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
  MOE_CHECK(q.is_object(), "config.json: quantization_config must be an object, got {}", json_brief(q));
  MOE_CHECK(q.contains("quant_method") && q["quant_method"].is_string(),
            "config.json: quantization_config has no quant_method string (expected \"fp8\", \"gptq\", \"awq\" or "
            "\"compressed-tensors\")");
  c.method_name = q["quant_method"].get<std::string>();
  if (c.method_name == "gptq" || c.method_name == "awq" || c.method_name == "compressed-tensors") {
    c.method = c.method_name == "gptq"  ? QuantConfig::Method::Gptq
               : c.method_name == "awq" ? QuantConfig::Method::Awq
                                        : QuantConfig::Method::CompressedTensors;
    if (c.method == QuantConfig::Method::CompressedTensors)
      parse_compressed_tensors(q, c);
    else
      parse_gptq_awq(q, c);
    read_list(q, "modules_to_not_convert", c);
    read_list(q, "ignored_layers", c);
    read_list(q, "ignore", c);
    return c;
  }
  MOE_CHECK(c.method_name == "fp8",
            "config.json: quantization_config.quant_method \"{}\" is not supported (moe-ep reads \"fp8\": e4m3 "
            "weights with block scales, as DeepSeek-V3 and Qwen3-FP8 publish them; \"gptq\", \"awq\" and "
            "\"compressed-tensors\" int4 weights; int8 W8A8 checkpoints need no quantization_config)",
            c.method_name);
  c.method = QuantConfig::Method::Fp8;
  if (q.contains("fmt") && !q["fmt"].is_null()) {
    MOE_CHECK(q["fmt"].is_string() && q["fmt"].get<std::string>() == "e4m3",
              "config.json: quantization_config.fmt {} is not supported (expected \"e4m3\")", json_brief(q["fmt"]));
  }
  if (q.contains("activation_scheme") && !q["activation_scheme"].is_null()) {
    MOE_CHECK(q["activation_scheme"].is_string() && q["activation_scheme"].get<std::string>() == "dynamic",
              "config.json: quantization_config.activation_scheme {} is not supported (expected \"dynamic\": moe-ep "
              "computes FP8 layers with bf16 activations and has no static FP8 input scales)",
              json_brief(q["activation_scheme"]));
  }
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const auto& b = q["weight_block_size"];
    MOE_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(),
              "config.json: quantization_config.weight_block_size must be [rows, cols], got {}", json_brief(b));
    c.block_n = b[0].get<int64_t>();
    c.block_k = b[1].get<int64_t>();
    // 2^20: far above any published block (128) and small enough that block arithmetic
    // on int64 shapes cannot overflow.
    MOE_CHECK(c.block_n > 0 && c.block_k > 0 && c.block_n <= (1 << 20) && c.block_k <= (1 << 20),
              "config.json: quantization_config.weight_block_size must be positive (and at most 2^20), got {}",
              json_brief(b));
  }
  read_list(q, "modules_to_not_convert", c);
  read_list(q, "ignored_layers", c);
  return c;
}

}  // namespace moe
