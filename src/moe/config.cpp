#include "moe/config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_brief.h"

namespace moe {

namespace {

using json = nlohmann::json;

struct FamilyName {
  const char* model_type;
  Family family;
};
constexpr FamilyName kFamilies[] = {
    {"qwen3_moe", Family::Qwen3Moe},     {"qwen2_moe", Family::Qwen2Moe},
    {"mixtral", Family::Mixtral},        {"deepseek_v2", Family::DeepseekV2},
    {"deepseek_v3", Family::DeepseekV3}, {"ernie4_5_moe", Family::Ernie45Moe},
};

// Reads the first present key of `names`; integers must be whole and in range.
const json* find_field(const json& cfg, std::initializer_list<const char*> names, const char** found) {
  for (const char* n : names) {
    auto it = cfg.find(n);
    if (it != cfg.end() && !it->is_null()) {
      *found = n;
      return &*it;
    }
  }
  return nullptr;
}

std::string names_str(std::initializer_list<const char*> names) {
  std::string s;
  for (const char* n : names) s += std::string(s.empty() ? "" : " or ") + "'" + n + "'";
  return s;
}

int64_t get_int(const json& cfg, std::initializer_list<const char*> names, std::optional<int64_t> dflt = {}) {
  const char* name = nullptr;
  const json* v = find_field(cfg, names, &name);
  if (!v) {
    MOE_CHECK(dflt.has_value(), "config.json: missing field {} (an integer)", names_str(names));
    return *dflt;
  }
  // An unsigned value past int64 would wrap to a negative one in get<int64_t>().
  MOE_CHECK(v->is_number_integer() && !(v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)),
            "config.json: field '{}' must be an integer, found {}", name, json_brief(*v));
  return v->get<int64_t>();
}

// The shared experts' intermediate size: n_shared experts of moe_intermediate_size each,
// refused before the product can overflow (neither factor is validated yet).
int64_t shared_size(int64_t moe_intermediate, const json& cfg, const char* n_shared_field) {
  const int64_t n = get_int(cfg, {n_shared_field}, 0);
  int64_t size = 0;
  MOE_CHECK(n >= 0 && !__builtin_mul_overflow(moe_intermediate, n, &size),
            "config.json: {} = {} shared experts of moe_intermediate_size {}: expected a count >= 0 whose total "
            "size fits in 64 bits",
            n_shared_field, n, moe_intermediate);
  return size;
}

double get_float(const json& cfg, std::initializer_list<const char*> names, double dflt) {
  const char* name = nullptr;
  const json* v = find_field(cfg, names, &name);
  if (!v) return dflt;
  MOE_CHECK(v->is_number(), "config.json: field '{}' must be a number, found {}", name, json_brief(*v));
  const double d = v->get<double>();
  MOE_CHECK(std::isfinite(d), "config.json: field '{}' must be finite, found {}", name, d);
  return d;
}

std::string get_string(const json& cfg, const char* name, const std::string& dflt) {
  auto it = cfg.find(name);
  if (it == cfg.end() || it->is_null()) return dflt;
  MOE_CHECK(it->is_string(), "config.json: field '{}' must be a string, found {}", name, json_brief(*it));
  return it->get<std::string>();
}

}  // namespace

const char* family_name(Family f) {
  for (const auto& e : kFamilies)
    if (e.family == f) return e.model_type;
  return "?";
}

std::string supported_model_types() {
  std::string s;
  for (const auto& e : kFamilies) s += std::string(s.empty() ? "" : ", ") + e.model_type;
  return s;
}

MoeConfig MoeConfig::from_hf(const json& cfg) {
  MOE_CHECK(cfg.is_object(), "config.json must be a JSON object");
  MoeConfig c;
  c.model_type = get_string(cfg, "model_type", "");
  MOE_CHECK(!c.model_type.empty(), "config.json: missing field 'model_type' (supported: {})",
            supported_model_types());
  const FamilyName* fam = nullptr;
  for (const auto& e : kFamilies)
    if (c.model_type == e.model_type) fam = &e;
  MOE_CHECK(fam, "config.json: unsupported model_type '{}' (supported: {})", c.model_type,
            supported_model_types());
  c.family = fam->family;

  c.hidden_size = get_int(cfg, {"hidden_size"});
  c.n_layers = get_int(cfg, {"num_hidden_layers"});
  c.n_mtp_layers = get_int(cfg, {"num_nextn_predict_layers"}, 0);
  c.act = parse_activation(get_string(cfg, "hidden_act", "silu"));
  RoutingConfig& r = c.routing;

  switch (c.family) {
    case Family::Qwen3Moe:
    case Family::Qwen2Moe: {
      c.n_experts = get_int(cfg, {"num_experts", "num_local_experts"});  // transformers 5 writes the latter
      c.top_k = get_int(cfg, {"num_experts_per_tok"});
      c.moe_intermediate_size = get_int(cfg, {"moe_intermediate_size"});
      c.dense_intermediate_size = get_int(cfg, {"intermediate_size"}, 0);
      c.decoder_sparse_step = get_int(cfg, {"decoder_sparse_step"}, 1);
      if (auto it = cfg.find("mlp_only_layers"); it != cfg.end() && !it->is_null()) {
        MOE_CHECK(it->is_array(), "config.json: 'mlp_only_layers' must be a list of layer indices");
        for (const auto& v : *it) {
          MOE_CHECK(v.is_number_integer(), "config.json: 'mlp_only_layers' holds {}, expected integers", json_brief(v));
          c.mlp_only_layers.push_back(v.get<int64_t>());
        }
      }
      r.scoring = Scoring::Softmax;
      r.renormalize = config_flag(cfg, "norm_topk_prob", c.family == Family::Qwen3Moe);
      if (c.family == Family::Qwen2Moe) {
        c.shared_intermediate_size = get_int(cfg, {"shared_expert_intermediate_size"}, 0);
        c.shared_expert_gate = c.shared_intermediate_size > 0;
      }
      break;
    }
    case Family::Mixtral: {
      c.n_experts = get_int(cfg, {"num_local_experts"});
      c.top_k = get_int(cfg, {"num_experts_per_tok"});
      c.moe_intermediate_size = get_int(cfg, {"intermediate_size"});
      // Mixtral takes the softmax over the top-k logits: the same as softmax over all
      // experts followed by renormalisation over the chosen k.
      r.scoring = Scoring::Softmax;
      r.renormalize = true;
      break;
    }
    case Family::DeepseekV2:
    case Family::DeepseekV3: {
      const bool v3 = c.family == Family::DeepseekV3;
      c.n_experts = get_int(cfg, {"n_routed_experts"});
      c.top_k = get_int(cfg, {"num_experts_per_tok"});
      c.moe_intermediate_size = get_int(cfg, {"moe_intermediate_size"});
      c.dense_intermediate_size = get_int(cfg, {"intermediate_size"}, 0);
      c.shared_intermediate_size = shared_size(c.moe_intermediate_size, cfg, "n_shared_experts");
      c.first_k_dense_replace = get_int(cfg, {"first_k_dense_replace"}, 0);
      c.moe_layer_freq = get_int(cfg, {"moe_layer_freq"}, 1);
      const std::string scoring = get_string(cfg, "scoring_func", v3 ? "sigmoid" : "softmax");
      MOE_CHECK(scoring == "softmax" || scoring == "sigmoid",
                "config.json: scoring_func '{}' not supported (expected softmax or sigmoid)", scoring);
      r.scoring = scoring == "sigmoid" ? Scoring::Sigmoid : Scoring::Softmax;
      const std::string method = get_string(cfg, "topk_method", v3 ? "noaux_tc" : "greedy");
      if (method == "noaux_tc") {
        r.use_correction_bias = true;
        r.group_score = GroupScore::SumTop2;
      } else if (method == "group_limited_greedy") {
        r.group_score = GroupScore::Max;
      } else {
        MOE_CHECK(method == "greedy",
                  "config.json: topk_method '{}' not supported (expected greedy, group_limited_greedy or noaux_tc)",
                  method);
      }
      if (method != "greedy") {
        r.n_group = get_int(cfg, {"n_group"}, 1);
        r.topk_group = get_int(cfg, {"topk_group"}, 1);
      }
      r.renormalize = config_flag(cfg, "norm_topk_prob", v3);
      r.renorm_eps = 1e-20f;
      r.scaling = static_cast<float>(get_float(cfg, {"routed_scaling_factor"}, 1.0));
      break;
    }
    case Family::Ernie45Moe: {
      c.n_experts = get_int(cfg, {"moe_num_experts"});
      c.top_k = get_int(cfg, {"moe_k"});
      c.moe_intermediate_size = get_int(cfg, {"moe_intermediate_size"});
      c.dense_intermediate_size = get_int(cfg, {"intermediate_size"}, 0);
      c.shared_intermediate_size = shared_size(c.moe_intermediate_size, cfg, "moe_num_shared_experts");
      c.moe_layer_start_index = get_int(cfg, {"moe_layer_start_index"}, 0);
      c.moe_layer_end_index = get_int(cfg, {"moe_layer_end_index"}, -1);
      c.moe_layer_interval = get_int(cfg, {"moe_layer_interval"}, 1);
      r.scoring = Scoring::Softmax;
      r.use_correction_bias = true;  // moe_statics.e_score_correction_bias picks experts
      r.renormalize = true;
      r.renorm_min = static_cast<float>(get_float(cfg, {"moe_norm_min"}, 1e-12));
      MOE_CHECK(!config_flag(cfg, "use_bias", false),
                "config.json: use_bias=true (linear biases) is not supported for ernie4_5_moe");
      break;
    }
  }
  c.validate();
  return c;
}

MoeConfig MoeConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  MOE_CHECK(in.good(), "cannot open {}: expected a Hugging Face config.json", path);
  json cfg;
  try {
    cfg = json::parse(in);
  } catch (const json::exception& e) {
    MOE_FAIL("{} is not valid JSON: {}", path, e.what());
  }
  try {
    return from_hf(cfg);
  } catch (const Error& e) {
    throw Error(fmt::format("{} ({})", e.what(), path));
  }
}

bool MoeConfig::is_moe_layer(int64_t layer) const {
  if (n_experts <= 0) return false;
  switch (family) {
    case Family::Qwen3Moe:
    case Family::Qwen2Moe:
      return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end() &&
             (layer + 1) % decoder_sparse_step == 0;
    case Family::Mixtral: return true;
    case Family::DeepseekV2:
    case Family::DeepseekV3: return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
    case Family::Ernie45Moe: {
      const int64_t end = moe_layer_end_index < 0 ? n_layers - 1 : moe_layer_end_index;
      return (layer + 1) % moe_layer_interval == 0 && layer >= moe_layer_start_index && layer <= end;
    }
  }
  return false;
}

void MoeConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    MOE_CHECK(v > 0, "config.json: {} must be positive, found {}", what, v);
  };
  positive(hidden_size, "hidden_size");
  positive(n_layers, "num_hidden_layers");
  positive(n_experts, "the number of routed experts");
  positive(top_k, "the number of experts per token");
  positive(moe_intermediate_size, "moe_intermediate_size");
  // Upper bounds far above any real model (DeepSeek-V3: 61 layers, H 7168, E 256), so a
  // hostile config.json cannot make a loop over layers or a size computation run
  // away before any tensor is checked.
  auto bounded = [](int64_t v, int64_t limit, const char* what) {
    MOE_CHECK(v <= limit, "config.json: {} = {} is implausibly large (limit {})", what, v, limit);
  };
  bounded(n_layers, 1 << 16, "num_hidden_layers");
  MOE_CHECK(n_mtp_layers >= 0 && n_mtp_layers <= 1 << 8,
            "config.json: num_nextn_predict_layers = {} is out of range [0, 256]", n_mtp_layers);
  bounded(hidden_size, 1 << 20, "hidden_size");
  bounded(n_experts, 1 << 20, "the number of routed experts");
  bounded(top_k, 1 << 12, "the number of experts per token");
  bounded(moe_intermediate_size, 1 << 24, "moe_intermediate_size");
  bounded(dense_intermediate_size, 1 << 24, "intermediate_size");
  bounded(shared_intermediate_size, 1 << 24, "the shared experts' intermediate size");
  MOE_CHECK(top_k <= n_experts, "config.json: {} experts per token but only {} experts", top_k, n_experts);
  MOE_CHECK(dense_intermediate_size >= 0 && shared_intermediate_size >= 0,
            "config.json: intermediate sizes must not be negative");
  MOE_CHECK(decoder_sparse_step > 0 && moe_layer_freq > 0 && moe_layer_interval > 0,
            "config.json: decoder_sparse_step, moe_layer_freq and moe_layer_interval must be positive");
  if (routing.n_group > 1) {
    MOE_CHECK(n_experts % routing.n_group == 0, "config.json: n_group={} does not divide {} experts",
              routing.n_group, n_experts);
    MOE_CHECK(routing.topk_group >= 1 && routing.topk_group <= routing.n_group,
              "config.json: topk_group={} must be in [1, n_group={}]", routing.topk_group, routing.n_group);
    MOE_CHECK(top_k <= routing.topk_group * (n_experts / routing.n_group),
              "config.json: top_k={} exceeds the {} experts in topk_group={} groups", top_k,
              routing.topk_group * (n_experts / routing.n_group), routing.topk_group);
  }
  MOE_CHECK(std::isfinite(routing.scaling) && routing.scaling > 0,
            "config.json: routed_scaling_factor must be positive and finite, found {}", routing.scaling);
}

std::string MoeConfig::summary() const {
  return fmt::format(
      "{}: H={} layers={} E={} k={} I={} shared_I={}{} dense_I={} scoring={} groups={}/{} bias={} renorm={} "
      "scale={}",
      model_type, hidden_size, n_layers, n_experts, top_k, moe_intermediate_size, shared_intermediate_size,
      shared_expert_gate ? "(gated)" : "", dense_intermediate_size,
      routing.scoring == Scoring::Softmax ? "softmax" : "sigmoid", routing.topk_group, routing.n_group,
      routing.use_correction_bias, routing.renormalize, routing.scaling);
}

}  // namespace moe
