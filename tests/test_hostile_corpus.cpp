// A corpus of broken and hostile checkpoints, made here by a generator: each one must
// give a clear error (naming what is wrong) and exit status exactly 1 (never a
// signal, never a sanitizer report) from both `moe-ep inspect` and `moe-ep layer`.
// scripts/test_sanitize.sh runs this suite under AddressSanitizer + UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/safetensors.h"
#include "test_util.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
void write_all(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}
std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// Copies fixture `name` (sharded or not) to dst as one model.safetensors, with optional
// edits of tensors and config.
void copy_fixture(const std::string& name, const std::string& dst, const std::function<void(Tensors&)>& edit = {},
                  const std::function<void(json&)>& edit_config = {}) {
  const std::string src = test::fixtures_dir() + "/" + name;
  const Checkpoint ck = Checkpoint::open(src);
  Tensors ts;
  for (const std::string& key : ck.keys()) ts.emplace_back(key, ck.view(key).clone());
  if (edit) edit(ts);
  write_safetensors(dst + "/model.safetensors", ts);
  json cfg = json::parse(read_all(src + "/config.json"));
  if (edit_config) edit_config(cfg);
  write_all(dst + "/config.json", cfg.dump(2));
}

// A mixtral config next to a raw model.safetensors: header text, then data bytes.
void raw_checkpoint(const std::string& dst, const std::string& header, size_t data_bytes,
                    std::optional<uint64_t> header_len = std::nullopt) {
  copy_fixture("mixtral", dst);
  write_all(dst + "/model.safetensors", le64(header_len.value_or(header.size())) + header + std::string(data_bytes, '\0'));
}

void replace_tensor(Tensors& ts, const std::string& key, Tensor t) {
  for (auto& [name, v] : ts)
    if (name == key) v = std::move(t);
}
void erase_tensor(Tensors& ts, const std::string& key) {
  std::erase_if(ts, [&](const auto& p) { return p.first == key; });
}

// A sharded mixtral: two shards plus an index, with `extra` appended to weight_map.
// `drop_key`: left out of its shard file but still listed in the index.
void sharded(const std::string& dst, const std::string& extra, bool drop_second_shard = false,
             const std::string& drop_key = "") {
  copy_fixture("mixtral", dst);
  auto file = SafetensorsFile::open(dst + "/model.safetensors");
  Tensors a, b;
  json wm = json::object();
  for (const TensorInfo& info : file->tensors()) {
    const bool first = info.name.find("layers.1.") == std::string::npos;
    if (info.name != drop_key) (first ? a : b).emplace_back(info.name, file->view(info.name).clone());
    wm[info.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  file.reset();
  fs::remove(dst + "/model.safetensors");
  write_safetensors(dst + "/model-00001-of-00002.safetensors", a);
  if (!drop_second_shard) write_safetensors(dst + "/model-00002-of-00002.safetensors", b);
  std::string text = json{{"metadata", json::object()}, {"weight_map", wm}}.dump();
  text.insert(text.size() - 2, extra);  // before the closing "}}"
  write_all(dst + "/model.safetensors.index.json", text);
}

struct Case {
  std::string name;
  std::string fixture;  // whose golden input `layer` runs on
  int layer;
  std::function<void(const std::string&)> make;
  std::vector<std::string> words;  // the error must mention each
};

const char* kL0 = "model.layers.0.block_sparse_moe.";

std::vector<Case> corpus() {
  std::vector<Case> c;
  auto mix = [&](std::string name, std::function<void(const std::string&)> make, std::vector<std::string> words) {
    c.push_back({std::move(name), "mixtral", 0, std::move(make), std::move(words)});
  };
  auto raw = [&](std::string name, std::string header, size_t data, std::vector<std::string> words,
                 std::optional<uint64_t> len = std::nullopt) {
    mix(std::move(name), [=](const std::string& d) { raw_checkpoint(d, header, data, len); }, std::move(words));
  };
  const std::string W1 = std::string(kL0) + "experts.7.w1.weight";
  // --- the safetensors container
  mix("truncated_file", [](const std::string& d) {
    copy_fixture("mixtral", d);
    fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") / 2);
  }, {"model.safetensors", "past the end"});
  mix("empty_file", [](const std::string& d) { copy_fixture("mixtral", d); write_all(d + "/model.safetensors", ""); },
      {"at least 8"});
  raw("header_length_past_eof", "{}", 0, {"runs past the end"}, 4096);
  raw("header_length_2_pow_63", "{}", 16, {"exceeds the cap"}, 1ull << 63);
  raw("invalid_json", "{\"a\": {\"dtype\": ", 0, {"not valid JSON"});
  raw("header_not_object", "[1, 2, 3]", 0, {"expected a JSON object"});
  raw("nul_in_header", std::string("{\"a\"\0:1}", 8), 0, {"NUL"});
  raw("unknown_dtype", R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", 1, {"unknown dtype", "F4"});
  raw("dtype_not_string", R"({"w": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})", 8, {"dtype"});
  raw("shape_bytes_mismatch", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20,
      {"needs 24 bytes", "20 bytes"});
  raw("overlapping_ranges",
      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
      24, {"overlap"});
  raw("range_past_eof", R"({"w": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}})", 100,
      {"past the end of the data area"});
  raw("begin_after_end", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8, {"begin > end"});
  raw("negative_shape", R"({"w": {"dtype": "F32", "shape": [-2, 2], "data_offsets": [0, 16]}})", 16,
      {"non-negative"});
  raw("negative_offset", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", 16, {"data_offsets"});
  raw("huge_shape", R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 16]}})",
      16, {"overflows"});
  raw("duplicate_key", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
      8, {"twice"});
  raw("metadata_not_strings", R"({"__metadata__": {"format": 3}})", 0, {"__metadata__"});
  // --- sharded checkpoints and the index
  mix("index_names_missing_shard", [](const std::string& d) { sharded(d, "", /*drop_second_shard=*/true); },
      {"model-00002-of-00002.safetensors", "does not exist"});
  mix("index_duplicate_key", [](const std::string& d) {
    sharded(d, std::string(", \"") + kL0 + "gate.weight\": \"model-00001-of-00002.safetensors\"");
  }, {"twice", "index.json"});
  mix("index_key_missing_from_shard", [W1](const std::string& d) { sharded(d, "", false, W1); },
      {W1, "missing from that file"});
  mix("index_path_escapes_directory", [](const std::string& d) {
    sharded(d, ", \"evil\": \"../model.safetensors\"");
  }, {"evil", "plain file name"});
  mix("no_weights", [](const std::string& d) { copy_fixture("mixtral", d); fs::remove(d + "/model.safetensors"); },
      {"no weights"});
  // --- config.json
  mix("nan_in_config", [](const std::string& d) {
    copy_fixture("mixtral", d);
    std::string t = read_all(d + "/config.json");
    t.replace(t.find("\"rms_norm_eps\": 1e-05"), 21, "\"rms_norm_eps\": NaN");
    write_all(d + "/config.json", t);
  }, {"config.json", "not valid JSON"});
  mix("config_not_object", [](const std::string& d) { copy_fixture("mixtral", d); write_all(d + "/config.json", "[1]"); },
      {"config.json", "expected a JSON object"});
  auto cfg = [&](std::string name, std::function<void(json&)> edit, std::vector<std::string> words) {
    mix(std::move(name), [edit](const std::string& d) { copy_fixture("mixtral", d, {}, edit); }, std::move(words));
  };
  cfg("unknown_model_type", [](json& j) { j["model_type"] = "llama4"; }, {"llama4", "supported", "mixtral"});
  cfg("missing_model_type", [](json& j) { j.erase("model_type"); }, {"model_type"});
  cfg("zero_hidden_size", [](json& j) { j["hidden_size"] = 0; }, {"hidden_size", "positive"});
  cfg("negative_experts", [](json& j) { j["num_local_experts"] = -8; }, {"positive", "-8"});
  cfg("zero_layers", [](json& j) { j["num_hidden_layers"] = 0; }, {"num_hidden_layers", "positive"});
  cfg("hidden_size_not_integer", [](json& j) { j["hidden_size"] = 32.5; }, {"hidden_size", "integer"});
  cfg("top_k_exceeds_experts", [](json& j) { j["num_experts_per_tok"] = 9; }, {"9 experts per token"});
  cfg("huge_hidden_size", [](json& j) { j["hidden_size"] = int64_t(1) << 40; }, {"1099511627776"});
  cfg("huge_expert_count", [](json& j) { j["num_local_experts"] = int64_t(1) << 40; }, {"1099511627776"});
  cfg("experts_more_than_tensors", [](json& j) { j["num_local_experts"] = 9; }, {"gate.weight", "[8, 32]", "[9, 32]"});
  cfg("huge_intermediate", [](json& j) { j["intermediate_size"] = int64_t(1) << 40; }, {"1099511627776"});
  // --- the MoE block's tensors
  mix("missing_expert_7_of_8", [W1](const std::string& d) {
    copy_fixture("mixtral", d, [&](Tensors& ts) { erase_tensor(ts, W1); });
  }, {W1, "layer 0", "[24, 32]"});
  mix("wrong_expert_shape", [W1](const std::string& d) {
    copy_fixture("mixtral", d, [&](Tensors& ts) { replace_tensor(ts, W1, Tensor::zeros({23, 32}, DType::F32)); });
  }, {W1, "[23, 32]", "[24, 32]", "model.safetensors"});
  mix("zero_size_expert", [W1](const std::string& d) {
    copy_fixture("mixtral", d, [&](Tensors& ts) { replace_tensor(ts, W1, Tensor::zeros({0, 32}, DType::F32)); });
  }, {W1, "[0, 32]"});
  mix("expert_int_dtype", [W1](const std::string& d) {
    copy_fixture("mixtral", d, [&](Tensors& ts) { replace_tensor(ts, W1, Tensor::zeros({24, 32}, DType::I32)); });
  }, {W1, "dtype"});
  mix("router_wrong_shape", [](const std::string& d) {
    copy_fixture("mixtral", d, [](Tensors& ts) {
      replace_tensor(ts, std::string(kL0) + "gate.weight", Tensor::zeros({8, 31}, DType::F32));
    });
  }, {"gate.weight", "[8, 31]", "[8, 32]"});
  c.push_back({"bad_fused_shape", "mixtral", 0, [](const std::string& d) {
                 copy_fixture("mixtral_fused", d, [](Tensors& ts) {
                   replace_tensor(ts, "model.layers.0.mlp.experts.gate_up_proj", Tensor::zeros({8, 47, 32}, DType::F32));
                 });
               }, {"gate_up_proj", "[8, 47, 32]", "[8, 48, 32]"}});
  c.push_back({"bias_wrong_length", "deepseek_v3", 1, [](const std::string& d) {
                 copy_fixture("deepseek_v3", d, [](Tensors& ts) {
                   replace_tensor(ts, "model.layers.1.mlp.gate.e_score_correction_bias", Tensor::zeros({33}, DType::F32));
                 });
               }, {"e_score_correction_bias", "[33]", "[32]"}});
  c.push_back({"missing_shared_expert", "deepseek_v3", 1, [](const std::string& d) {
                 copy_fixture("deepseek_v3", d, [](Tensors& ts) {
                   erase_tensor(ts, "model.layers.1.mlp.shared_experts.down_proj.weight");
                 });
               }, {"shared_experts.down_proj.weight", "missing"}});
  return c;
}

int run(const std::string& args, std::string* log) { return test::run_command(std::string(MOE_EP_BINARY) + " " + args, log); }

void expect_clean_failure(int rc, const std::string& log, const std::vector<std::string>& words) {
  EXPECT_EQ(rc, 1) << log;  // 1: a clean error exit; a signal reads 128+N
  EXPECT_NE(log.find("moe-ep: error:"), std::string::npos) << log;
  EXPECT_EQ(log.find("Sanitizer"), std::string::npos) << log;
  EXPECT_EQ(log.find("runtime error"), std::string::npos) << log;
  for (const auto& w : words) EXPECT_NE(log.find(w), std::string::npos) << "missing '" << w << "' in:\n" << log;
}

TEST(HostileCorpus, EveryCaseFailsCleanlyFromInspectAndLayer) {
  const auto cases = corpus();
  EXPECT_GE(cases.size(), 30u);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    test::TempDir d;
    k.make(d.path());
    std::string log;
    int rc = run("inspect --model " + d.path() + " --ep 2", &log);
    expect_clean_failure(rc, log, k.words);
    const std::string in = test::fixtures_dir() + "/" + k.fixture + "/golden/L" + std::to_string(k.layer) +
                           "_T7_in.safetensors";
    rc = run("layer --model " + d.path() + " --layer " + std::to_string(k.layer) + " --input " + in + " --output " +
                 (d / "y.safetensors"),
             &log);
    expect_clean_failure(rc, log, k.words);
  }
}

TEST(HostileCorpus, UnexpectedTensorWarnsOrFailsWithStrict) {
  test::TempDir d;
  const std::string extra = std::string(kL0) + "experts.8.w1.weight";  // E = 8: no expert 8
  copy_fixture("mixtral", d.path(), [&](Tensors& ts) { ts.emplace_back(extra, Tensor::zeros({24, 32}, DType::F32)); });
  const std::string in = test::fixtures_dir() + "/mixtral/golden/L0_T7_in.safetensors";
  const std::string layer = "layer --model " + d.path() + " --layer 0 --input " + in + " --output " + (d / "y.safetensors");
  std::string log;
  EXPECT_EQ(run(layer, &log), 0) << log;
  EXPECT_NE(log.find("warning"), std::string::npos) << log;
  EXPECT_NE(log.find(extra), std::string::npos) << log;
  expect_clean_failure(run(layer + " --strict", &log), log, {extra, "unexpected", "--strict"});
  EXPECT_EQ(run("inspect --model " + d.path(), &log), 0) << log;
  EXPECT_NE(log.find("warning: layer 0: unexpected tensor '" + extra + "'"), std::string::npos) << log;
  expect_clean_failure(run("inspect --strict --model " + d.path(), &log), log, {extra, "unexpected"});
  // A stray tensor from a layer the config does not have.
  test::TempDir d2;
  copy_fixture("mixtral", d2.path(), [&](Tensors& ts) {
    ts.emplace_back("model.layers.5.block_sparse_moe.gate.weight", Tensor::zeros({8, 32}, DType::F32));
  });
  expect_clean_failure(run("inspect --strict --model " + d2.path(), &log), log, {"model.layers.5", "num_hidden_layers=2"});
  // A config claiming more layers than the checkpoint has tensors (inspect would loop).
  test::TempDir d3;
  copy_fixture("mixtral", d3.path(), {}, [](json& j) { j["num_hidden_layers"] = int64_t(1) << 40; });
  expect_clean_failure(run("inspect --model " + d3.path(), &log), log, {"num_hidden_layers", "1099511627776"});
}

// Outside the MLP blocks `inspect` checks every tensor the model reads (embeddings,
// lm_head, norms, attention of both kinds, q/k/v biases): each problem is a clean exit 1
// naming the key, the layer and the shapes, and `forward`, which loads the whole model,
// fails on the same tensor.
TEST(HostileCorpus, BrokenNonMlpTensorsFailInspectAndForward) {
  struct NonMlpCase {
    std::string name, fixture;
    std::function<void(Tensors&)> edit;
    std::vector<std::string> words;
  };
  const std::string q0 = "model.layers.0.self_attn.q_proj.", k1 = "model.layers.1.self_attn.k_proj.weight";
  const std::vector<NonMlpCase> cases = {
      {"missing_gqa_k_proj", "qwen3_moe", [&](Tensors& ts) { erase_tensor(ts, k1); },
       {k1, "layer 1", "missing", "[16, 40]"}},
      {"wrong_shape_norm", "qwen3_moe",
       [](Tensors& ts) {
         replace_tensor(ts, "model.layers.2.post_attention_layernorm.weight", Tensor::zeros({39}, DType::BF16));
       },
       {"model.layers.2.post_attention_layernorm.weight", "layer 2", "[39]", "[40]", "model.safetensors"}},
      {"missing_q_norm", "qwen3_moe", [](Tensors& ts) { erase_tensor(ts, "model.layers.0.self_attn.q_norm.weight"); },
       {"model.layers.0.self_attn.q_norm.weight", "layer 0", "[8]"}},
      {"missing_qkv_bias", "qwen2_moe", [&](Tensors& ts) { erase_tensor(ts, q0 + "bias"); },
       {q0 + "bias", "layer 0", "missing", "[32]"}},
      {"wrong_shape_mla_kv_b", "deepseek_v2",
       [](Tensors& ts) {
         replace_tensor(ts, "model.layers.1.self_attn.kv_b_proj.weight", Tensor::zeros({64, 15}, DType::F32));
       },
       {"model.layers.1.self_attn.kv_b_proj.weight", "layer 1", "[64, 15]", "[64, 16]"}},
      {"missing_mla_q_a_norm", "deepseek_v3",
       [](Tensors& ts) { erase_tensor(ts, "model.layers.2.self_attn.q_a_layernorm.weight"); },
       {"model.layers.2.self_attn.q_a_layernorm.weight", "layer 2", "[24]"}},
      {"missing_lm_head", "mixtral", [](Tensors& ts) { erase_tensor(ts, "lm_head.weight"); },
       {"lm_head.weight", "missing", "[128, 32]"}},
      {"wrong_shape_embeddings", "ernie4_5_moe",
       [](Tensors& ts) { replace_tensor(ts, "model.embed_tokens.weight", Tensor::zeros({96, 31}, DType::F32)); },
       {"model.embed_tokens.weight", "[96, 31]", "[96, 32]"}},
      {"int_attention_weight", "mixtral",
       [&](Tensors& ts) { replace_tensor(ts, q0 + "weight", Tensor::zeros({32, 32}, DType::I32)); },
       {q0 + "weight", "dtype"}},
  };
  for (const NonMlpCase& k : cases) {
    SCOPED_TRACE(k.name);
    test::TempDir d;
    copy_fixture(k.fixture, d.path(), k.edit);
    std::string log;
    expect_clean_failure(run("inspect --model " + d.path() + " --ep 2 --tp 2", &log), log, k.words);
    EXPECT_NE(log.find("problems: 1 missing/mis-shaped, 0 unexpected"), std::string::npos) << log;
    expect_clean_failure(
        run("forward --model " + d.path() + " --prompt-ids 1,2 --logits " + (d / "logits.safetensors"), &log), log,
        {k.words[0]});
  }
}

// A tensor the model does not read, anywhere: a warning (the model runs), an error
// with --strict.
TEST(HostileCorpus, UnreadNonMlpTensorsAreUnexpected) {
  struct Extra {
    std::string fixture, key, why;
  };
  const std::vector<Extra> extras = {
      {"mixtral", "model.layers.1.self_attn.rotary_emb.inv_freq", "layer 1: unexpected tensor"},
      {"qwen3_moe", "model.layers.0.self_attn.o_proj.bias", "layer 0: unexpected tensor"},  // attention_bias false
      {"ernie4_5_moe", "lm_head.weight", "unexpected tensor 'lm_head.weight'"},              // tied embeddings
      {"deepseek_v2", "model.vision_tower.weight", "unexpected tensor 'model.vision_tower.weight'"},
  };
  for (const Extra& x : extras) {
    SCOPED_TRACE(x.key);
    test::TempDir d;
    copy_fixture(x.fixture, d.path(), [&](Tensors& ts) { ts.emplace_back(x.key, Tensor::zeros({4}, DType::F32)); });
    std::string log;
    EXPECT_EQ(run("inspect --model " + d.path(), &log), 0) << log;
    EXPECT_NE(log.find("warning: " + x.why), std::string::npos) << log;
    EXPECT_NE(log.find(x.key), std::string::npos) << log;
    expect_clean_failure(run("inspect --strict --model " + d.path(), &log), log, {x.key, "unexpected"});
  }
}

TEST(HostileCorpus, RandomByteFlipsOfAHeaderNeverCrashTheCli) {
  // Deterministic corruption of the JSON header of a real fixture: every outcome must
  // be exit 0 (a harmless flip) or a clean exit 1.
  test::TempDir d;
  copy_fixture("mixtral_gelu", d.path());
  const std::string good = read_all(d / "model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(good[i]);
  uint64_t s = 12345;
  for (int trial = 0; trial < 12; ++trial) {
    std::string bad = good;
    for (int f = 0; f < 3; ++f) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      bad[8 + (s >> 33) % n] = static_cast<char>((s >> 20) & 0xff);
    }
    write_all(d / "model.safetensors", bad);
    std::string log;
    const int rc = run("inspect --model " + d.path(), &log);
    SCOPED_TRACE(trial);
    EXPECT_TRUE(rc == 0 || rc == 1) << rc << "\n" << log;
    EXPECT_EQ(log.find("Sanitizer"), std::string::npos) << log;
    EXPECT_EQ(log.find("runtime error"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace moe
