#include "loader/gguf/gguf_deepseek.h"

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "loader/gguf/gguf_file.h"

namespace moe::gguf {

namespace {

constexpr uint32_t kGatingSoftmax = 1, kGatingSigmoid = 2;  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE

}  // namespace

void deepseek2_config(const GgufModel& m, nlohmann::json& c) {
  const Metadata& md = m.metadata();
  const std::string& file = m.parts().front()->path();
  const std::string k = "deepseek2.";
  const uint32_t gating = md.opt_u32(k + "expert_gating_func").value_or(kGatingSoftmax);
  MOE_CHECK(gating == kGatingSoftmax || gating == kGatingSigmoid, "gguf model '{}': {}expert_gating_func is {}, "
            "expected 1 (softmax, DeepSeek-V2) or 2 (sigmoid, DeepSeek-V3)", file, k, gating);
  const bool v3 = gating == kGatingSigmoid;
  c["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  c["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  // MLA is multi-head in the Hugging Face config (the GGUF says 1 KV head: its MQA view).
  c["num_key_value_heads"] = c["num_attention_heads"];
  c.erase("head_dim");
  if (auto q = md.opt_u32(k + "attention.q_lora_rank")) c["q_lora_rank"] = *q;
  else c["q_lora_rank"] = nullptr;
  c["kv_lora_rank"] = md.get_u32(k + "attention.kv_lora_rank");
  const int64_t rope = md.get_u32(k + "rope.dimension_count");
  // key_length_mla / value_length_mla: the per-head sizes since the converter split
  // kv_b; before, key_length / value_length held them.
  const bool mla_keys = md.contains(k + "attention.key_length_mla");
  const int64_t qk = md.get_u32(k + (mla_keys ? "attention.key_length_mla" : "attention.key_length"));
  const int64_t v = md.get_u32(k + (mla_keys ? "attention.value_length_mla" : "attention.value_length"));
  MOE_CHECK(rope >= 1 && qk > rope && v >= 1, "gguf model '{}': the query/key head size {} must exceed "
            "{}rope.dimension_count {} (and the value head size {} be >= 1)", file, qk, k, rope, v);
  c["qk_rope_head_dim"] = rope;
  c["qk_nope_head_dim"] = qk - rope;
  c["v_head_dim"] = v;
  c["rope_interleave"] = true;  // DeepSeek's q_pe / k_pe pairs, as transformers' default

  c["n_routed_experts"] = md.get_u32(k + "expert_count");
  c["num_experts_per_tok"] = md.get_u32(k + "expert_used_count");
  c["moe_intermediate_size"] = md.get_u32(k + "expert_feed_forward_length");
  c["intermediate_size"] = md.opt_u32(k + "feed_forward_length").value_or(0);
  c["n_shared_experts"] = md.opt_u32(k + "expert_shared_count").value_or(0);
  c["first_k_dense_replace"] = md.opt_u32(k + "leading_dense_block_count").value_or(0);
  c["moe_layer_freq"] = 1;
  c["routed_scaling_factor"] = md.opt_f32(k + "expert_weights_scale").value_or(1.0f);
  c["norm_topk_prob"] = md.opt_bool(k + "expert_weights_norm").value_or(false);
  c["scoring_func"] = v3 ? "sigmoid" : "softmax";
  const int64_t groups = md.opt_u32(k + "expert_group_count").value_or(1);
  c["n_group"] = groups;
  c["topk_group"] = md.opt_u32(k + "expert_group_used_count").value_or(1);
  c["topk_method"] = v3 ? "noaux_tc" : groups > 1 ? "group_limited_greedy" : "greedy";
  if (v3)
    MOE_CHECK(m.find(fmt::format("blk.{}.exp_probs_b.bias", c["first_k_dense_replace"].get<int64_t>())) != nullptr,
              "gguf model '{}': sigmoid gating (DeepSeek-V3) without blk.N.exp_probs_b.bias, the router's selection "
              "bias", file);
  if (c.contains("rope_scaling") && c["rope_scaling"]["rope_type"] == "yarn") {
    if (auto lm = md.opt_f32(k + "rope.scaling.yarn_log_multiplier")) {
      c["rope_scaling"]["mscale_all_dim"] = *lm / 0.1;
      c["rope_scaling"]["mscale"] = *lm / 0.1;
    }
  }
}

void check_kv_b_halves(const GgufModel& m, const nlohmann::json& config) {
  const std::string& file = m.parts().front()->path();
  const int64_t L = config["num_hidden_layers"].get<int64_t>();
  const int64_t H = config["num_attention_heads"].get<int64_t>();
  const int64_t R = config["kv_lora_rank"].get<int64_t>();
  const int64_t nope = config["qk_nope_head_dim"].get<int64_t>(), v = config["v_head_dim"].get<int64_t>();
  for (int64_t l = 0; l < L; ++l) {
    const GgufTensor* kb = m.find(fmt::format("blk.{}.attn_k_b.weight", l));
    const GgufTensor* vb = m.find(fmt::format("blk.{}.attn_v_b.weight", l));
    if (!kb && !vb) continue;
    MOE_CHECK(kb && vb, "gguf model '{}': layer {} has {} but not {}: the converter writes both halves of kv_b_proj",
              file, l, kb ? kb->describe() : vb->describe(), kb ? "attn_v_b" : "attn_k_b");
    MOE_CHECK(kb->n_dims == 3 && kb->ne[0] == nope && kb->ne[1] == R && kb->ne[2] == H, "gguf model '{}': {} should "
              "be [heads {}, kv_lora_rank {}, qk_nope_head_dim {}]", file, kb->describe(), H, R, nope);
    MOE_CHECK(vb->n_dims == 3 && vb->ne[0] == R && vb->ne[1] == v && vb->ne[2] == H, "gguf model '{}': {} should "
              "be [heads {}, v_head_dim {}, kv_lora_rank {}]", file, vb->describe(), H, v, R);
  }
}

}  // namespace moe::gguf
