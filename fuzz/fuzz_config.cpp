// libFuzzer: arbitrary bytes as config.json. Text that is not JSON is skipped (that is
// nlohmann's parser, not ours); a JSON value goes through the three readers of a
// checkpoint's config, as a model load runs them:
//   parse_quant_config   (loader/quant_config.h: the quantization_config block)
//   MoeConfig::from_hf   (moe/config.h: experts, routing, which layers are MoE)
//   model_config_from_hf (model/registry.h: the whole model, with the family's hooks)
// Each must give a config or throw moe::Error: a crash, a sanitizer report (signed
// overflow, a float-to-int conversion out of range), another exception (an nlohmann
// type_error from a field of the wrong type) or an allocation past -rss_limit_mb (a
// hostile layer or expert count) is a bug in the parser. A config that parses must
// keep its promises (positive, bounded sizes; the RoPE table and the attention keys of
// the first and last layer can be built from it).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "fuzz_assert.h"
#include "loader/quant_config.h"
#include "model/registry.h"
#include "moe/config.h"

namespace {

void quant(const nlohmann::json& j) {
  moe::QuantConfig q;
  try {
    q = moe::parse_quant_config(j);
  } catch (const moe::Error&) {
    return;
  }
  FUZZ_ASSERT(q.fp8() == (q.method_name == "fp8"));
  FUZZ_ASSERT(q.block_n > 0 && q.block_k > 0 && q.block_n <= (1 << 20) && q.block_k <= (1 << 20));
  size_t regexes = 0;
  for (const std::string& e : q.not_converted) {
    FUZZ_ASSERT(!e.empty());
    if (e.starts_with("re:")) ++regexes;  // a pattern, compiled once (not_converted_re)
    else FUZZ_ASSERT(q.ignores(e));       // a name matches itself, on whole components
  }
  FUZZ_ASSERT(q.not_converted_re.size() == regexes);
  for (const char* key : {"lm_head.weight", "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate_proj.weight",
                          "model.layers.1.mlp.experts.gate_up_proj", ""})
    (void)q.ignores(moe::module_of(key));
}

void moe_config(const nlohmann::json& j) {
  moe::MoeConfig c;
  try {
    c = moe::MoeConfig::from_hf(j);
  } catch (const moe::Error&) {
    return;
  }
  FUZZ_ASSERT(c.hidden_size > 0 && c.n_layers > 0 && c.n_experts > 0 && c.top_k > 0 && c.top_k <= c.n_experts);
  // The layer plan of the first layers (all of them in a real model: 61 at most today).
  for (int64_t l = 0; l < c.n_layers && l < 256; ++l) (void)c.is_moe_layer(l);
  (void)c.summary();
}

void model_config(const nlohmann::json& j) {
  moe::ModelConfig c;
  try {
    c = moe::model_config_from_hf(j);
  } catch (const moe::Error&) {
    return;
  }
  FUZZ_ASSERT(c.vocab_size > 0 && c.hidden_size > 0 && c.n_layers > 0 && c.n_heads > 0);
  FUZZ_ASSERT(c.moe.hidden_size == c.hidden_size && c.moe.n_layers == c.n_layers);
  FUZZ_ASSERT(c.rope.dim > 0);
  (void)c.summary();
  const moe::FamilyHooks& fam = moe::find_family(c.model_type);
  (void)fam.attention_keys(c, 0);
  (void)fam.attention_keys(c, c.n_layers - 1);
  try {
    double attention_factor = 0;
    const std::vector<float> inv = moe::rope_inv_freq(c.rope, &attention_factor);
    FUZZ_ASSERT(static_cast<int64_t>(inv.size()) == c.rope.dim / 2);
  } catch (const moe::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  quant(j);
  moe_config(j);
  model_config(j);
  return 0;
}
