// Writes a large random-weight qwen3_moe checkpoint for loader benchmarks (not a
// model anyone should run): config.json, one safetensors shard per decoder layer and
// model.safetensors.index.json. Standalone (no moe-ep code), so it checks our reader
// against an independent writer too.
//
//   g++ -O2 -std=c++20 -o /tmp/gen_big_checkpoint tools/gen_big_checkpoint.cpp
//   /tmp/gen_big_checkpoint [--deepseek-v3] /tmp/moe_big [layers=4] [experts=64] [hidden=2048] [moe_I=768]
//                           [fused=0] [vocab=4096] [heads=16] [kv_heads=4] [head_dim=hidden/heads]
//
// --deepseek-v3: a deepseek_v3 checkpoint of DeepSeek-V3's structure at these widths
// (scripts/bench_wire.sh measures its traffic): MLA attention with V3's own ranks and
// head dims (q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v 128; `heads` query
// heads, kv_heads and head_dim unused), layer 0 a dense MLP of 4 moe_I, the others
// `experts` routed experts (sigmoid scores, correction bias, 8 groups, top-4 groups,
// top-8) plus one shared expert of moe_I; per-expert tensors (fused unused).
//
// Qwen3-30B-A3B's attention is 32 query heads and 4 KV heads of 128 (q_proj 4096 x 2048,
// so head_dim is not hidden/heads): `... 4 128 2048 768 0 VOCAB 32 4 128` writes it.
//
// Default size: 4 layers x 64 experts x 3 x 768 x 2048 bf16 = 2.42 GB of experts,
// plus attention, router, norms, embeddings (~2.5 GB in all). Weights are random bf16
// values in +-[2^-8, 2^-6) (finite, no NaN), from a fixed-seed xorshift.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

struct Entry {
  std::string name;
  std::vector<int64_t> shape;
};

uint64_t g_state = 0x9E3779B97F4A7C15ull;
inline uint64_t next() {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}

void fill_bf16(uint16_t* p, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint64_t r = next();
    for (int j = 0; j < 4; ++j) {
      const uint16_t v = static_cast<uint16_t>(r >> (16 * j));
      // sign | exponent 119..120 (2^-8..2^-7 scale) | 7 random mantissa bits
      p[i + j] = static_cast<uint16_t>((v & 0x8000) | ((119 + ((v >> 7) & 1)) << 7) | (v & 0x7f));
    }
  }
  for (; i < n; ++i) p[i] = 0x3c00;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void write_shard(const std::string& path, const std::vector<Entry>& entries) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t off = 0;
  for (const Entry& e : entries) {
    const uint64_t nb = static_cast<uint64_t>(numel(e.shape)) * 2;
    header += ",\"" + e.name + "\":{\"dtype\":\"BF16\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) header += (i ? "," : "") + std::to_string(e.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + nb) + "]}";
    off += nb;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  std::fwrite(len, 1, 8, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::vector<uint16_t> buf(1 << 22);
  for (const Entry& e : entries) {
    int64_t left = numel(e.shape);
    while (left > 0) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(buf.size())));
      fill_bf16(buf.data(), n);
      if (std::fwrite(buf.data(), 2, n, f) != n) {
        std::perror("write");
        std::exit(1);
      }
      left -= static_cast<int64_t>(n);
    }
  }
  if (std::fclose(f) != 0) {
    std::perror("close");
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool deepseek = argc > 1 && std::string(argv[1]) == "--deepseek-v3";
  if (deepseek) {
    --argc;
    ++argv;
  }
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s DIR [layers=4] [experts=64] [hidden=2048] [moe_I=768] [fused=0] [vocab=4096] "
                 "[heads=16] [kv_heads=4] [head_dim=hidden/heads]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t L = argc > 2 ? std::atoll(argv[2]) : 4, E = argc > 3 ? std::atoll(argv[3]) : 64,
                H = argc > 4 ? std::atoll(argv[4]) : 2048, I = argc > 5 ? std::atoll(argv[5]) : 768;
  const bool fused = argc > 6 && std::atoi(argv[6]) != 0;
  const int64_t V = argc > 7 ? std::atoll(argv[7]) : 4096, heads = argc > 8 ? std::atoll(argv[8]) : 16,
                kv_heads = argc > 9 ? std::atoll(argv[9]) : 4, hd = argc > 10 ? std::atoll(argv[10]) : H / heads;
  if (deepseek && E % 8 != 0) {
    std::fprintf(stderr, "--deepseek-v3: experts (%lld) must divide into DeepSeek-V3's 8 routing groups\n", (long long)E);
    return 2;
  }
  if (L < 1 || E < 1 || H < 1 || I < 1 || V < 1 || heads < 1 || kv_heads < 1 || hd < 1 || heads % kv_heads != 0) {
    std::fprintf(stderr, "every size must be >= 1 and heads (%lld) a multiple of kv_heads (%lld)\n", (long long)heads,
                 (long long)kv_heads);
    return 2;
  }
  std::filesystem::create_directories(dir);
  std::string index = "{\"metadata\":{},\"weight_map\":{";
  bool first_key = true;
  const int n_shards = static_cast<int>(L) + 1;
  auto shard_name = [&](int s) {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    return std::string(b);
  };
  for (int s = 0; s < n_shards; ++s) {
    std::vector<Entry> es;
    if (s == static_cast<int>(L)) {
      es = {{"model.embed_tokens.weight", {V, H}}, {"lm_head.weight", {V, H}}, {"model.norm.weight", {H}}};
    } else if (deepseek) {
      // DeepSeek-V3's MLA ranks and head dims (its config.json).
      const int64_t q_lora = 1536, kv_lora = 512, nope = 128, rope = 64, vd = 128;
      const std::string p = "model.layers." + std::to_string(s) + ".";
      es.push_back({p + "input_layernorm.weight", {H}});
      es.push_back({p + "post_attention_layernorm.weight", {H}});
      es.push_back({p + "self_attn.q_a_proj.weight", {q_lora, H}});
      es.push_back({p + "self_attn.q_a_layernorm.weight", {q_lora}});
      es.push_back({p + "self_attn.q_b_proj.weight", {heads * (nope + rope), q_lora}});
      es.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {kv_lora + rope, H}});
      es.push_back({p + "self_attn.kv_a_layernorm.weight", {kv_lora}});
      es.push_back({p + "self_attn.kv_b_proj.weight", {heads * (nope + vd), kv_lora}});
      es.push_back({p + "self_attn.o_proj.weight", {H, heads * vd}});
      if (s == 0) {  // first_k_dense_replace 1
        es.push_back({p + "mlp.gate_proj.weight", {4 * I, H}});
        es.push_back({p + "mlp.up_proj.weight", {4 * I, H}});
        es.push_back({p + "mlp.down_proj.weight", {H, 4 * I}});
      } else {
        es.push_back({p + "mlp.gate.weight", {E, H}});
        es.push_back({p + "mlp.gate.e_score_correction_bias", {E}});
        for (int64_t e = 0; e < E; ++e) {
          const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
          es.push_back({q + "gate_proj.weight", {I, H}});
          es.push_back({q + "up_proj.weight", {I, H}});
          es.push_back({q + "down_proj.weight", {H, I}});
        }
        es.push_back({p + "mlp.shared_experts.gate_proj.weight", {I, H}});
        es.push_back({p + "mlp.shared_experts.up_proj.weight", {I, H}});
        es.push_back({p + "mlp.shared_experts.down_proj.weight", {H, I}});
      }
    } else {
      const std::string p = "model.layers." + std::to_string(s) + ".";
      es.push_back({p + "input_layernorm.weight", {H}});
      es.push_back({p + "post_attention_layernorm.weight", {H}});
      es.push_back({p + "self_attn.q_proj.weight", {heads * hd, H}});
      es.push_back({p + "self_attn.k_proj.weight", {kv_heads * hd, H}});
      es.push_back({p + "self_attn.v_proj.weight", {kv_heads * hd, H}});
      es.push_back({p + "self_attn.o_proj.weight", {H, heads * hd}});  // in: heads * hd, may differ from H
      es.push_back({p + "self_attn.q_norm.weight", {hd}});
      es.push_back({p + "self_attn.k_norm.weight", {hd}});
      es.push_back({p + "mlp.gate.weight", {E, H}});
      if (fused) {
        es.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * I, H}});
        es.push_back({p + "mlp.experts.down_proj", {E, H, I}});
      } else {
        for (int64_t e = 0; e < E; ++e) {
          const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
          es.push_back({q + "gate_proj.weight", {I, H}});
          es.push_back({q + "up_proj.weight", {I, H}});
          es.push_back({q + "down_proj.weight", {H, I}});
        }
      }
    }
    write_shard(dir + "/" + shard_name(s), es);
    for (const Entry& e : es) {
      index += (first_key ? "\"" : ",\"") + e.name + "\":\"" + shard_name(s) + "\"";
      first_key = false;
    }
  }
  index += "}}";
  FILE* f = std::fopen((dir + "/model.safetensors.index.json").c_str(), "w");
  std::fputs(index.c_str(), f);
  std::fclose(f);
  f = std::fopen((dir + "/config.json").c_str(), "w");
  if (deepseek)
    std::fprintf(f,
                 "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
                 "\"hidden_size\": %lld, \"num_hidden_layers\": %lld, \"first_k_dense_replace\": 1, "
                 "\"intermediate_size\": %lld, \"moe_intermediate_size\": %lld, \"n_routed_experts\": %lld, "
                 "\"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"n_group\": 8, \"topk_group\": 4, "
                 "\"topk_method\": \"noaux_tc\", \"scoring_func\": \"sigmoid\", \"norm_topk_prob\": true, "
                 "\"routed_scaling_factor\": 2.5, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, "
                 "\"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, "
                 "\"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"vocab_size\": %lld, \"rms_norm_eps\": 1e-06, "
                 "\"rope_theta\": 10000, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false, "
                 "\"num_nextn_predict_layers\": 0, \"torch_dtype\": \"bfloat16\"}\n",
                 (long long)H, (long long)L, (long long)(4 * I), (long long)I, (long long)E, (long long)heads,
                 (long long)heads, (long long)V);
  else
  std::fprintf(f,
               "{\"model_type\": \"qwen3_moe\", \"hidden_size\": %lld, \"num_hidden_layers\": %lld, "
               "\"num_experts\": %lld, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": %lld, "
               "\"intermediate_size\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, "
               "\"head_dim\": %lld, \"vocab_size\": %lld, \"norm_topk_prob\": true, \"torch_dtype\": \"bfloat16\"}\n",
               (long long)H, (long long)L, (long long)E, (long long)I, (long long)(4 * I), (long long)heads,
               (long long)kv_heads, (long long)hd, (long long)V);
  std::fclose(f);
  std::printf("wrote %s: %lld layers, %lld experts, H=%lld, I=%lld, %s\n", dir.c_str(), (long long)L, (long long)E,
              (long long)H, (long long)I, fused ? "fused" : "per-expert");
  return 0;
}
