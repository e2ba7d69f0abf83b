#include "loader/gguf/gguf_checkpoint.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <optional>

#include "core/check.h"
#include "loader/gguf/gguf_deepseek.h"
#include "loader/gguf/gguf_file.h"
#include "loader/gguf/gguf_types.h"

namespace moe::gguf {

namespace {

constexpr const char* kSupportedArchs = "qwen3moe, qwen2moe, llama (with experts: Mixtral), ernie4_5-moe, deepseek2";

struct Arch {
  std::string name;      // general.architecture
  std::string hf_model;  // model_type
  std::string hf_class;  // architectures[0]
  bool shared = false;   // one shared expert with a sigmoid gate (Qwen2-MoE)
  bool norm_topk = false;
  // The Hugging Face names of the MLP block: Mixtral's Hub checkpoints keep the experts
  // under block_sparse_moe with w1 (gate), w3 (up) and w2 (down).
  std::string moe_block = "mlp";
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
  // The shared expert(s) (ffn_*_shexp): Qwen2-MoE's mlp.shared_expert, ERNIE's
  // mlp.shared_experts (one FFN of moe_num_shared_experts x moe_intermediate_size).
  std::string shared_block = "mlp.shared_expert";
  // exp_probs_b.bias, the selection-only router bias: ERNIE's moe_statics.
  std::string router_bias = "";
};

Arch arch_of(const GgufModel& m) {
  const std::string& file = m.parts().front()->path();
  const std::string a = m.metadata().get_str("general.architecture");
  if (a == "qwen3moe") return {a, "qwen3_moe", "Qwen3MoeForCausalLM", false, true};
  if (a == "qwen2moe") return {a, "qwen2_moe", "Qwen2MoeForCausalLM", true, false};
  if (a == "llama") {
    MOE_CHECK(m.metadata().opt_u32("llama.expert_count").value_or(0) > 1, "gguf model '{}': architecture 'llama' "
              "without llama.expert_count > 1 is a dense model; this engine runs MoE models", file);
    return {a, "mixtral", "MixtralForCausalLM", false, true, "block_sparse_moe", "w1", "w3", "w2"};
  }
  if (a == "ernie4_5-moe") {
    Arch r{a, "ernie4_5_moe", "Ernie4_5_MoeForCausalLM"};
    r.shared_block = "mlp.shared_experts";
    r.router_bias = "mlp.moe_statics.e_score_correction_bias";
    return r;
  }
  if (a == "deepseek2") {  // model_type (V2 or V3) comes from the gating function: gguf_deepseek.h
    Arch r{a, "", ""};
    r.shared_block = "mlp.shared_experts";
    r.router_bias = "mlp.gate.e_score_correction_bias";
    return r;
  }
  MOE_FAIL("gguf model '{}': general.architecture '{}' is not a supported architecture (supported: {})", file, a,
           kSupportedArchs);
}

// The layer indices that have routed experts (the others are dense MLPs).
bool has_experts(const GgufModel& m, int64_t l) {
  return m.find(fmt::format("blk.{}.ffn_gate_exps.weight", l)) != nullptr;
}

// ERNIE-4.5-MoE's config.json keys from what convert_hf_to_gguf.py writes. MoE layers
// are every interleave_moe_layer_step-th from leading_dense_block_count on; GGUF has no
// moe_layer_end_index, so it is the last layer with experts, and the layers that have
// them must be exactly the ones that rule names. The shared experts' size is taken from
// their tensors, not from expert_shared_feed_forward_length: the converter writes
// intermediate_size / num_key_value_heads there, which is the shared FFN's size for the
// released models (moe_num_shared_experts x moe_intermediate_size) only by their shapes.
void ernie_moe_config(const GgufModel& m, nlohmann::json& c) {
  const Metadata& md = m.metadata();
  const std::string& file = m.parts().front()->path();
  const std::string k = "ernie4_5-moe.";
  const int64_t L = c["num_hidden_layers"].get<int64_t>();
  c["moe_num_experts"] = md.get_u32(k + "expert_count");
  c["moe_k"] = md.get_u32(k + "expert_used_count");
  c["moe_intermediate_size"] = md.get_u32(k + "expert_feed_forward_length");
  c["intermediate_size"] = md.opt_u32(k + "feed_forward_length").value_or(0);
  const int64_t start = md.opt_u32(k + "leading_dense_block_count").value_or(0);
  const int64_t step = md.opt_u32(k + "interleave_moe_layer_step").value_or(1);
  MOE_CHECK(step >= 1, "gguf model '{}': {}interleave_moe_layer_step is 0, expected >= 1", file, k);
  int64_t last = -1;
  for (int64_t l = 0; l < L; ++l)
    if (has_experts(m, l)) last = l;
  MOE_CHECK(last >= 0, "gguf model '{}': no layer has ffn_gate_exps: an ernie4_5-moe model has routed experts", file);
  for (int64_t l = 0; l < L; ++l) {
    const bool moe = (l + 1) % step == 0 && l >= start && l <= last;
    MOE_CHECK(moe == has_experts(m, l), "gguf model '{}': layer {} {} ffn_gate_exps, but {}leading_dense_block_count "
              "{} and interleave_moe_layer_step {} make it a {} layer", file, l, moe ? "lacks" : "has", k, start, step,
              moe ? "MoE" : "dense");
  }
  c["moe_layer_start_index"] = start;
  c["moe_layer_interval"] = step;
  c["moe_layer_end_index"] = last;
  const int64_t n_shared = md.opt_u32(k + "expert_shared_count").value_or(0);
  c["moe_num_shared_experts"] = n_shared;
  if (n_shared > 0) {
    const GgufTensor* sh = m.find(fmt::format("blk.{}.ffn_up_shexp.weight", last));
    MOE_CHECK(sh != nullptr, "gguf model '{}': {}expert_shared_count is {} but blk.{}.ffn_up_shexp.weight is missing",
              file, k, n_shared, last);
    const int64_t per = c["moe_intermediate_size"].get<int64_t>();
    MOE_CHECK(per > 0 && sh->ne[1] == n_shared * per, "gguf model '{}': {} has {} rows, expected {}expert_shared_count "
              "x expert_feed_forward_length = {} x {}", file, sh->describe(), sh->ne[1], k, n_shared, per);
  }
  c["use_bias"] = false;
  c["moe_norm_min"] = 1e-12;  // ERNIE's default; GGUF does not carry it
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[4] = {};
  const bool ok = std::fread(magic, 1, 4, f) == 4 && magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' &&
                  magic[3] == 'F';
  std::fclose(f);
  return ok;
}

nlohmann::json config_from_gguf(const GgufModel& m) {
  const Arch a = arch_of(m);
  const Metadata& md = m.metadata();
  auto key = [&](const char* k) { return a.name + "." + k; };
  const std::string& file = m.parts().front()->path();

  nlohmann::json c;
  c["architectures"] = {a.hf_class};
  c["model_type"] = a.hf_model;
  const int64_t L = md.get_u32(key("block_count"));
  const int64_t H = md.get_u32(key("embedding_length"));
  const int64_t heads = md.get_u32(key("attention.head_count"));
  // Every layer has tensors of its own (its norms at least), so a block_count above the
  // tensor count is a broken file, not a model to loop over.
  MOE_CHECK(L >= 1 && static_cast<uint64_t>(L) <= m.n_tensors(), "gguf model '{}': {} is {}, but the file has {} "
            "tensors (expected 1 to that many layers)", file, key("block_count"), L, m.n_tensors());
  MOE_CHECK(H >= 1 && heads >= 1, "gguf model '{}': {} is {} and {} is {}, expected both >= 1", file,
            key("embedding_length"), H, key("attention.head_count"), heads);
  c["num_hidden_layers"] = L;
  c["hidden_size"] = H;
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = md.opt_u32(key("attention.head_count_kv")).value_or(static_cast<uint32_t>(heads));
  c["head_dim"] = md.opt_u32(key("attention.key_length"))
                      .value_or(md.opt_u32(key("rope.dimension_count")).value_or(static_cast<uint32_t>(H / heads)));
  c["max_position_embeddings"] = md.get_u32(key("context_length"));
  c["rms_norm_eps"] = md.get_f32(key("attention.layer_norm_rms_epsilon"));
  c["rope_theta"] = md.opt_f32(key("rope.freq_base")).value_or(10000.0f);
  if (auto t = md.opt_str(key("rope.scaling.type")); t && *t != "none") {
    MOE_CHECK(*t == "yarn" || *t == "linear", "gguf model '{}': {} is '{}', expected none, linear or yarn", file,
              key("rope.scaling.type"), *t);
    nlohmann::json rs;
    rs["rope_type"] = *t;
    rs["factor"] = md.get_f32(key("rope.scaling.factor"));
    if (auto o = md.opt_u32(key("rope.scaling.original_context_length")))
      rs["original_max_position_embeddings"] = *o;
    c["rope_scaling"] = rs;
  }
  c["hidden_act"] = "silu";
  c["num_experts_per_tok"] = md.get_u32(key("expert_used_count"));
  if (a.name == "llama") {
    // Mixtral: every layer is MoE and feed_forward_length is the experts' size. llama.cpp's
    // converter permutes each head's q and k rows from rotate_half order (i, i + d/2) to
    // ggml's interleaved pairs (2i, 2i + 1), so RoPE here rotates interleaved pairs too
    // (DeepSeek-V3's config key): q.k is the same sum in another order.
    c["num_local_experts"] = md.get_u32(key("expert_count"));
    c["intermediate_size"] = md.get_u32(key("feed_forward_length"));
    c["rope_interleave"] = true;
    for (int64_t l = 0; l < L; ++l)
      MOE_CHECK(has_experts(m, l), "gguf model '{}': layer {} has no ffn_gate_exps: a llama model with experts "
                "(Mixtral) has them in every layer", file, l);
  } else if (a.name == "ernie4_5-moe") {
    ernie_moe_config(m, c);
  } else if (a.name == "deepseek2") {
    deepseek2_config(m, c);
  } else {
    c["intermediate_size"] = md.opt_u32(key("feed_forward_length")).value_or(0);
    c["moe_intermediate_size"] = md.get_u32(key("expert_feed_forward_length"));
    c["num_experts"] = md.get_u32(key("expert_count"));
    c["norm_topk_prob"] = a.norm_topk;
    c["decoder_sparse_step"] = 1;
    nlohmann::json dense = nlohmann::json::array();
    for (int64_t l = 0; l < L; ++l)
      if (!has_experts(m, l)) dense.push_back(l);
    c["mlp_only_layers"] = dense;
  }
  if (a.shared) c["shared_expert_intermediate_size"] = md.get_u32(key("expert_shared_feed_forward_length"));
  c["attention_bias"] = m.find("blk.0.attn_q.bias") != nullptr;
  const GgufTensor& emb = m.tensor("token_embd.weight");
  c["vocab_size"] = emb.ne[1];
  c["tie_word_embeddings"] = m.find("output.weight") == nullptr;
  if (auto v = md.opt_u32("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = *v;
  if (auto v = md.opt_u32("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = *v;
  // --dtype auto: f32 for a file whose weights are all f32, else bf16 (as for the fp16,
  // bf16 and quantised checkpoints of Hugging Face).
  bool all_f32 = true;
  for (const GgufTensor* t : m.tensors()) all_f32 = all_f32 && (t->n_dims < 2 || t->type == GgmlType::F32);
  c["torch_dtype"] = all_f32 ? "float32" : "bfloat16";
  c["gguf"] = {{"file", file}, {"architecture", a.name}};
  return c;
}

namespace {

// One GGUF tensor (or one expert's rows of a stacked one) under its Hugging Face name.
TensorInfo info_for(const GgufTensor& t, const std::string& name, Shape shape, uint64_t byte_begin,
                    uint64_t nbytes) {
  TensorInfo i;
  i.name = name;
  i.shape = std::move(shape);
  i.offset = t.offset + byte_begin;
  i.nbytes = nbytes;
  switch (t.type) {
    case GgmlType::F32: i.dtype = DType::F32; break;
    case GgmlType::F16: i.dtype = DType::F16; break;
    case GgmlType::BF16: i.dtype = DType::BF16; break;
    default:
      require_supported(t.type, t.name, t.file->path());
      i.dtype = DType::F32;
      i.ggml_type = static_cast<int32_t>(t.type);
  }
  return i;
}

// The Hugging Face name of a per-layer GGUF tensor suffix ("attn_q.weight" ->
// "self_attn.q_proj.weight"), or nullopt for one that is not per-layer or unknown.
std::optional<std::string> layer_name(const Arch& a, const std::string& suffix) {
  if (suffix == "ffn_gate_inp.weight") return a.moe_block + ".gate.weight";
  if (suffix == "ffn_gate_shexp.weight") return a.shared_block + ".gate_proj.weight";
  if (suffix == "ffn_up_shexp.weight") return a.shared_block + ".up_proj.weight";
  if (suffix == "ffn_down_shexp.weight") return a.shared_block + ".down_proj.weight";
  if (suffix == "exp_probs_b.bias" && !a.router_bias.empty()) return a.router_bias;
  if (a.name == "deepseek2") {  // MLA (attn_k_b / attn_v_b: gguf_deepseek.h)
    static const std::map<std::string, std::string> mla = {
        {"attn_q_a.weight", "self_attn.q_a_proj.weight"},     {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
        {"attn_q_b.weight", "self_attn.q_b_proj.weight"},     {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
        {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
        {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
    };
    if (auto it = mla.find(suffix); it != mla.end()) return it->second;
  }
  static const std::map<std::string, std::string> names = {
      {"attn_norm", "input_layernorm"},      {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},        {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},        {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},   {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate_inp_shexp", "mlp.shared_expert_gate"},
      {"ffn_gate", "mlp.gate_proj"},         {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  const size_t dot = suffix.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  auto it = names.find(suffix.substr(0, dot));
  if (it == names.end()) return std::nullopt;
  return it->second + suffix.substr(dot);  // ".weight" / ".bias"
}

std::map<std::string, std::string> expert_names(const Arch& a) {
  return {{"ffn_gate_exps.weight", a.gate + ".weight"},
          {"ffn_up_exps.weight", a.up + ".weight"},
          {"ffn_down_exps.weight", a.down + ".weight"}};
}

}  // namespace

CheckpointTables open_checkpoint_tables(const std::string& path) { return checkpoint_tables(GgufModel::open(path)); }

CheckpointTables checkpoint_tables(const GgufModel& m) {
  const std::string& path = m.parts().front()->path();
  CheckpointTables out;
  const Arch arch = arch_of(m);
  const std::map<std::string, std::string> experts = expert_names(arch);
  out.config = config_from_gguf(m);
  const int64_t L = out.config["num_hidden_layers"].get<int64_t>();
  if (arch.name == "deepseek2") check_kv_b_halves(m, out.config);
  for (const auto& part : m.parts()) {
    std::vector<TensorInfo> infos;
    for (const GgufTensor& t : part->tensors()) {
      const Shape shape = t.torch_shape();
      if (t.name == "token_embd.weight") {
        infos.push_back(info_for(t, "model.embed_tokens.weight", shape, 0, t.nbytes));
      } else if (t.name == "output_norm.weight") {
        infos.push_back(info_for(t, "model.norm.weight", shape, 0, t.nbytes));
      } else if (t.name == "output.weight") {
        infos.push_back(info_for(t, "lm_head.weight", shape, 0, t.nbytes));
      } else if (t.name.starts_with("blk.")) {
        const size_t dot = t.name.find('.', 4);
        int64_t l = -1;
        try {
          l = std::stoll(t.name.substr(4, dot - 4));
        } catch (const std::exception&) {
        }
        MOE_CHECK(dot != std::string::npos && l >= 0 && l < L, "gguf model '{}': tensor '{}' (in '{}') names no "
                  "layer of the {} the metadata has", path, t.name, part->path(), L);
        const std::string suffix = t.name.substr(dot + 1);
        const std::string prefix = fmt::format("model.layers.{}.", l);
        if (arch.name == "deepseek2" && (suffix == "attn_k_b.weight" || suffix == "attn_v_b.weight")) {
          // [heads, rows, cols] as [heads * rows, cols]: each head's rows, in their own type
          // (shapes checked against the config by check_kv_b_halves above).
          const std::string hf = suffix == "attn_k_b.weight" ? "self_attn.k_b_proj.weight" : "self_attn.v_b_proj.weight";
          infos.push_back(info_for(t, prefix + hf, {t.ne[2] * t.ne[1], t.ne[0]}, 0, t.nbytes));
        } else if (auto it = experts.find(suffix); it != experts.end()) {
          MOE_CHECK(t.n_dims == 3, "gguf model '{}': tensor {} should be 3-D [experts, rows, cols]", path,
                    t.describe());
          // Expert e is rows [e * ne[1], (e + 1) * ne[1]) of the [ne[2] * ne[1], ne[0]] rows.
          const uint64_t bytes_per_expert = t.row_bytes() * static_cast<uint64_t>(t.ne[1]);
          for (int64_t e = 0; e < t.ne[2]; ++e)
            infos.push_back(info_for(t, fmt::format("{}{}.experts.{}.{}", prefix, arch.moe_block, e, it->second),
                                     {t.ne[1], t.ne[0]},
                                     static_cast<uint64_t>(e) * bytes_per_expert, bytes_per_expert));
        } else if (auto hf = layer_name(arch, suffix)) {
          infos.push_back(info_for(t, prefix + *hf, shape, 0, t.nbytes));
        } else {
          MOE_FAIL("gguf model '{}': tensor {} is not one this engine knows for architecture '{}'", path,
                   t.describe(), out.config["gguf"]["architecture"].get<std::string>());
        }
      } else {
        MOE_FAIL("gguf model '{}': tensor {} is not one this engine knows", path, t.describe());
      }
    }
    out.files.push_back(
        SafetensorsFile::from_table(part->mapping(), part->file_size(), part->data_start(), part->path(), infos,
                                    part->backing()));
  }
  return out;
}

}  // namespace moe::gguf
