#include "model/model_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/json_brief.h"

namespace moe {

using nlohmann::json;

namespace {

int64_t get_int(const json& cfg, const char* key, int64_t dflt, bool required) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) {
    MOE_CHECK(!required, "config.json: missing field '{}'", key);
    return dflt;
  }
  // An unsigned value past int64 would wrap to a negative one in get<int64_t>().
  MOE_CHECK(it->is_number_integer() && !(it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)),
            "config.json: field '{}' is {}, expected an integer", key, json_brief(*it));
  return it->get<int64_t>();
}

std::string get_str(const json& cfg, const char* key, const std::string& dflt) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return dflt;
  MOE_CHECK(it->is_string(), "config.json: field '{}' is {}, expected a string", key, json_brief(*it));
  return it->get<std::string>();
}

double get_num(const json& obj, const char* key, double dflt) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  MOE_CHECK(it->is_number(), "config.json: field '{}' is {}, expected a number", key, json_brief(*it));
  return it->get<double>();
}

void read_eos(const json& j, std::vector<int64_t>& out) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return;
  out.clear();
  if (it->is_number_integer()) {
    out.push_back(it->get<int64_t>());
  } else if (it->is_array()) {
    for (const auto& v : *it)
      if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  }
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

void read_common_hparams(const json& cfg, ModelConfig& c) {
  c.model_type = get_str(cfg, "model_type", "");
  c.vocab_size = get_int(cfg, "vocab_size", 0, true);
  c.hidden_size = get_int(cfg, "hidden_size", 0, true);
  c.n_layers = get_int(cfg, "num_hidden_layers", 0, true);
  c.n_heads = get_int(cfg, "num_attention_heads", 0, true);
  c.n_kv_heads = get_int(cfg, "num_key_value_heads", c.n_heads, false);
  c.head_dim = get_int(cfg, "head_dim", c.n_heads > 0 ? c.hidden_size / c.n_heads : 0, false);
  c.rms_eps = get_num(cfg, "rms_norm_eps", 1e-6);
  c.max_position = get_int(cfg, "max_position_embeddings", 0, false);
  c.tie_embeddings = config_flag(cfg, "tie_word_embeddings", false);
  read_eos(cfg, c.eos_token_ids);

  // transformers 5 writes "rope_parameters" {rope_theta, rope_type, ...}; older
  // configs have "rope_theta" at the top and an optional "rope_scaling" {type, ...}.
  // Referred to, not copied: a copy of a hostile object recurses once per nesting level.
  static const json kNone = json::object();
  const json* rope = &kNone;
  if (auto it = cfg.find("rope_parameters"); it != cfg.end() && it->is_object()) rope = &*it;
  else if (auto it2 = cfg.find("rope_scaling"); it2 != cfg.end() && it2->is_object()) rope = &*it2;
  const json& rp = *rope;
  RopeConfig& r = c.rope;
  r.theta = get_num(rp, "rope_theta", get_num(cfg, "rope_theta", 10000.0));
  if (rp.contains("rope_type") && rp["rope_type"].is_string()) r.type = rp["rope_type"].get<std::string>();
  else if (rp.contains("type") && rp["type"].is_string()) r.type = rp["type"].get<std::string>();
  MOE_CHECK(r.type == "default" || r.type == "yarn",
            "config.json: rope type '{}' is not supported (expected default or yarn)", r.type);
  MOE_CHECK(get_num(rp, "partial_rotary_factor", get_num(cfg, "partial_rotary_factor", 1.0)) == 1.0,
            "config.json: partial_rotary_factor != 1 is not supported");
  if (r.type == "yarn") {
    r.factor = get_num(rp, "factor", 0.0);
    r.attention_factor = get_num(rp, "attention_factor", 0.0);
    r.mscale = get_num(rp, "mscale", 0.0);
    r.mscale_all_dim = get_num(rp, "mscale_all_dim", 0.0);
    r.beta_fast = get_num(rp, "beta_fast", 32.0);
    if (r.beta_fast == 0) r.beta_fast = 32.0;
    r.beta_slow = get_num(rp, "beta_slow", 1.0);
    if (r.beta_slow == 0) r.beta_slow = 1.0;
    // A double first (configs write 4096 or 4096.0); in range before the conversion,
    // which is undefined for a value an int64 cannot hold.
    const double omp = get_num(rp, "original_max_position_embeddings", 0.0);
    MOE_CHECK(omp >= 1 && omp <= double(int64_t{1} << 40),
              "config.json: yarn rope needs original_max_position_embeddings in [1, 2^40], found {}", omp);
    r.original_max_position = static_cast<int64_t>(omp);
    if (r.factor == 0) r.factor = static_cast<double>(c.max_position) / static_cast<double>(r.original_max_position);
    if (rp.contains("truncate") && rp["truncate"].is_boolean()) r.truncate = rp["truncate"].get<bool>();
  }
}

std::vector<float> rope_inv_freq(const RopeConfig& r, double* attention_factor) {
  const int64_t dim = r.dim, half = dim / 2;
  MOE_CHECK(dim > 0 && dim % 2 == 0, "rotary dimension {} must be positive and even", dim);
  std::vector<float> inv(half);
  // HF computes base ** (arange(0, dim, 2).float() / dim) in f32.
  std::vector<float> pos_freq(half);
  for (int64_t i = 0; i < half; ++i)
    pos_freq[i] = std::pow(static_cast<float>(r.theta), static_cast<float>(2 * i) / static_cast<float>(dim));
  double af = 1.0;
  if (r.type != "yarn") {
    for (int64_t i = 0; i < half; ++i) inv[i] = 1.0f / pos_freq[i];
  } else {
    af = r.attention_factor;
    if (af == 0) {
      af = (r.mscale != 0 && r.mscale_all_dim != 0)
               ? yarn_get_mscale(r.factor, r.mscale) / yarn_get_mscale(r.factor, r.mscale_all_dim)
               : yarn_get_mscale(r.factor, 1.0);
    }
    const double pi = 3.14159265358979323846;
    auto corr_dim = [&](double rot) {
      return (dim * std::log(r.original_max_position / (rot * 2 * pi))) / (2 * std::log(r.theta));
    };
    double low = corr_dim(r.beta_fast), high = corr_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const float ramp = std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.f, 1.f);
      const float extra = 1.f - ramp;  // extrapolation weight
      const float f_extra = 1.0f / pos_freq[i];
      const float f_inter = 1.0f / (static_cast<float>(r.factor) * pos_freq[i]);
      inv[i] = f_inter * (1 - extra) + f_extra * extra;
    }
  }
  if (attention_factor) *attention_factor = af;
  return inv;
}

void ModelConfig::validate() const {
  MOE_CHECK(vocab_size > 0 && hidden_size > 0 && n_layers > 0 && n_heads > 0,
            "config.json: vocab_size, hidden_size, num_hidden_layers and num_attention_heads must be positive");
  // Upper bounds far above any real model (as MoeConfig's), so the tensor shapes
  // computed from them (heads x head_dim x hidden, vocab x hidden) cannot overflow.
  auto bounded = [](int64_t v, int64_t limit, const char* what) {
    MOE_CHECK(v <= limit, "config.json: {} = {} is implausibly large (limit {})", what, v, limit);
  };
  bounded(vocab_size, int64_t{1} << 26, "vocab_size");
  bounded(n_heads, 1 << 16, "num_attention_heads");
  bounded(n_kv_heads, 1 << 16, "num_key_value_heads");
  bounded(head_dim, 1 << 16, "head_dim");
  bounded(q_lora_rank, 1 << 20, "q_lora_rank");
  bounded(kv_lora_rank, 1 << 20, "kv_lora_rank");
  bounded(qk_nope_head_dim, 1 << 16, "qk_nope_head_dim");
  bounded(qk_rope_head_dim, 1 << 16, "qk_rope_head_dim");
  bounded(v_head_dim, 1 << 16, "v_head_dim");
  if (attention == AttentionKind::Gqa) {
    MOE_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
              "config.json: num_attention_heads {} must be a multiple of num_key_value_heads {}", n_heads, n_kv_heads);
    MOE_CHECK(head_dim > 0 && head_dim % 2 == 0, "config.json: head_dim {} must be positive and even", head_dim);
  } else {
    MOE_CHECK(kv_lora_rank > 0 && qk_rope_head_dim > 0 && qk_nope_head_dim > 0 && v_head_dim > 0,
              "config.json: MLA needs kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim");
  }
  MOE_CHECK(moe.hidden_size == hidden_size && moe.n_layers == n_layers, "config.json: inconsistent hidden size");
}

std::string ModelConfig::summary() const {
  std::string attn = attention == AttentionKind::Mla
                         ? fmt::format("MLA heads {} q_lora {} kv_lora {} nope {} rope {} v {}", n_heads, q_lora_rank,
                                       kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
                         : fmt::format("GQA heads {}/{} head_dim {}{}", n_heads, n_kv_heads, head_dim,
                                       qk_norm ? " qk_norm" : "");
  return fmt::format("{}: vocab {}, hidden {}, {} layers, {}, rope {} theta {}{}{}", model_type, vocab_size,
                     hidden_size, n_layers, attn, rope.type, rope.theta, rope.interleaved ? " interleaved" : "",
                     tie_embeddings ? ", tied embeddings" : "");
}

}  // namespace moe
