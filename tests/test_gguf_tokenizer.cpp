// The tokenizer of a GGUF file (loader/gguf/gguf_tokenizer.h) against Hugging Face
// `tokenizers`: tests/fixtures/gguf/tokenizer/*.gguf are written by
// tools/gen_gguf_tokenizer_fixtures.py the way llama.cpp's convert_hf_to_gguf.py writes a
// model's tokenizer, and golden.json holds `tokenizers`' ids and decodings of the source
// tokenizer.json for every corpus text. Each GGUF, turned back into tokenizer.json text and
// run by text::Tokenizer, must give the same ids, decodings, special tokens and chat
// template. Then hostile metadata, built here byte by byte.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "core/check.h"
#include "loader/gguf/gguf_tokenizer.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using moe::gguf::GgufFile;
using moe::gguf::ValueType;
using moe::text::Tokenizer;

namespace {

const fs::path kDir = fs::path(MOE_FIXTURES_DIR) / "gguf" / "tokenizer";

json read_json(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  std::ostringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

const json& golden() {
  static const json g = read_json(kDir / "golden.json");
  return g;
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  for (const auto& [name, _] : golden()["fixtures"].items()) out.push_back(name);
  return out;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

class GgufTokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufTokenizerFixture, MatchesHuggingFaceTokenizers) {
  const json& g = golden()["fixtures"][GetParam()];
  const std::string path = (kDir / g["gguf"].get<std::string>()).string();
  auto file = GgufFile::open(path);
  const auto files = moe::gguf::tokenizer_files(file->metadata(), path);
  const auto tok = Tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json, path);
  ASSERT_EQ(tok->vocab_size(), g["n_tokens"].get<int64_t>());

  int n = 0;
  for (const json& c : g["cases"]) {
    const std::string text = c["text"];
    const auto ids = tok->encode(text);
    EXPECT_EQ(ids, ids_of(c["ids"])) << "text: " << text;
    EXPECT_EQ(tok->encode(text, {.add_special_tokens = false}), ids_of(c["ids_no_special"])) << "text: " << text;
    EXPECT_EQ(tok->decode(ids_of(c["ids"])), c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tok->decode(ids_of(c["ids"]), {.skip_special_tokens = true}), c["decoded_skip"].get<std::string>())
        << "text: " << text;
    // The incremental decoder (what generation uses) ends on the same text.
    moe::text::IncrementalDecoder inc(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += inc.push(id);
    EXPECT_EQ(streamed + inc.finish(), c["decoded"].get<std::string>());
    ++n;
  }
  EXPECT_GT(n, 100);

  const auto& sp = tok->special_tokens();
  EXPECT_EQ(sp.bos_id, g["special"]["bos_id"].get<int32_t>());
  EXPECT_EQ(sp.eos_id, g["special"]["eos_id"].get<int32_t>());
  EXPECT_EQ(sp.unk_id, g["special"]["unk_id"].get<int32_t>());
  EXPECT_EQ(sp.pad_id, g["special"]["pad_id"].get<int32_t>());

  // Every id keeps its token string, and llama.cpp's control tokens are the special ones.
  const auto& md = file->metadata();
  const auto tokens = md.get_str_array("tokenizer.ggml.tokens");
  const auto types = md.get_i32_array("tokenizer.ggml.token_type");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    EXPECT_EQ(tok->id_to_token(id), tokens[i]);
    EXPECT_EQ(tok->token_to_id(tokens[i]), id) << tokens[i];
    EXPECT_EQ(tok->is_special(id), types[i] == 3 || types[i] == 2) << tokens[i];
  }

  // The chat template is the source's, and renders as the source directory's does.
  if (g["template_source"].is_null()) {
    EXPECT_TRUE(files.chat_template.empty());
    EXPECT_FALSE(json::parse(files.tokenizer_config_json).contains("chat_template"));
    return;
  }
  const fs::path cfg = fs::path(MOE_FIXTURES_DIR) / g["template_source"].get<std::string>();
  EXPECT_EQ(files.chat_template, read_json(cfg)["chat_template"].get<std::string>());
  moe::text::ChatRequest req;
  req.messages =
      nlohmann::ordered_json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi!"},)"
                                    R"({"role":"assistant","content":"Hello."},{"role":"user","content":"2+2?"}])");
  const auto want = moe::text::ChatTemplate::from_dir(cfg.parent_path().string()).render(req, sp);
  EXPECT_EQ(moe::text::ChatTemplate(files.chat_template, path).render(req, sp), want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufTokenizerFixture, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

// ---- hostile metadata ----

const std::string kBad = "tok.gguf";

std::string le(uint64_t v, int n) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = 0; i < n; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string gstr(const std::string& s) { return le(s.size(), 8) + s; }
std::string vt(ValueType t) { return le(static_cast<uint32_t>(t), 4); }

// One key-value pair each.
std::string kv_str(const std::string& k, const std::string& v) { return gstr(k) + vt(ValueType::String) + gstr(v); }
std::string kv_u32(const std::string& k, uint32_t v) { return gstr(k) + vt(ValueType::U32) + le(v, 4); }
std::string kv_bool(const std::string& k, bool v) { return gstr(k) + vt(ValueType::Bool) + le(v, 1); }
std::string kv_strs(const std::string& k, const std::vector<std::string>& v) {
  std::string s = gstr(k) + vt(ValueType::Array) + vt(ValueType::String) + le(v.size(), 8);
  for (const auto& e : v) s += gstr(e);
  return s;
}
std::string kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
  std::string s = gstr(k) + vt(ValueType::Array) + vt(ValueType::I32) + le(v.size(), 8);
  for (int32_t e : v) s += le(static_cast<uint32_t>(e), 4);
  return s;
}
std::string kv_f32s(const std::string& k, const std::vector<float>& v) {
  std::string s = gstr(k) + vt(ValueType::Array) + vt(ValueType::F32) + le(v.size(), 8);
  for (float e : v) {
    uint32_t bits;
    std::memcpy(&bits, &e, 4);
    s += le(bits, 4);
  }
  return s;
}

// A file of these key-value pairs and no tensors, parsed from memory.
std::shared_ptr<GgufFile> gguf(const std::vector<std::string>& kvs) {
  std::string f = "GGUF" + le(3, 4) + le(0, 8) + le(kvs.size(), 8);
  for (const auto& k : kvs) f += k;
  std::shared_ptr<void> buf(std::malloc(f.size()), std::free);
  std::memcpy(buf.get(), f.data(), f.size());
  return GgufFile::from_bytes(buf, f.size(), kBad);
}

// A small valid byte-level file: "a", "b", "ab" and a control token; `replace` swaps in
// (or, with an empty value, drops) the pairs whose key it names.
std::vector<std::string> bpe_kvs(const std::map<std::string, std::string>& replace = {}) {
  std::vector<std::pair<std::string, std::string>> base = {
      {"tokenizer.ggml.model", kv_str("tokenizer.ggml.model", "gpt2")},
      {"tokenizer.ggml.pre", kv_str("tokenizer.ggml.pre", "qwen2")},
      {"tokenizer.ggml.tokens", kv_strs("tokenizer.ggml.tokens", {"a", "b", "ab", "<|x|>", "c"})},
      {"tokenizer.ggml.token_type", kv_i32s("tokenizer.ggml.token_type", {1, 1, 1, 3, 4})},
      {"tokenizer.ggml.merges", kv_strs("tokenizer.ggml.merges", {"a b"})},
  };
  std::vector<std::string> out;
  for (const auto& [k, v] : base)
    if (auto it = replace.find(k); it == replace.end())
      out.push_back(v);
    else if (!it->second.empty())
      out.push_back(it->second);
  for (const auto& [k, v] : replace)
    if (!v.empty() && std::none_of(base.begin(), base.end(), [&](const auto& b) { return b.first == k; }))
      out.push_back(v);
  return out;
}

moe::gguf::TokenizerFiles files_of(const std::vector<std::string>& kvs) {
  return moe::gguf::tokenizer_files(gguf(kvs)->metadata(), kBad);
}

void expect_error(const std::vector<std::string>& kvs, std::initializer_list<std::string> words) {
  try {
    files_of(kvs);
    ADD_FAILURE() << "no error; expected one containing '" << *words.begin() << "'";
  } catch (const moe::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(kBad), std::string::npos) << "does not name the file: " << msg;
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "no '" << w << "' in: " << msg;
  }
}

TEST(GgufTokenizer, SmallByteLevelFileWorks) {
  const auto f = files_of(bpe_kvs());
  const auto tok = Tokenizer::from_json(f.tokenizer_json, f.tokenizer_config_json, kBad);
  EXPECT_EQ(tok->encode("ab<|x|>c"), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_TRUE(tok->is_special(3));
  EXPECT_FALSE(tok->is_special(4));  // user-defined: matched in text, but not special
  EXPECT_EQ(tok->decode({2, 3, 4}, {.skip_special_tokens = true}), "abc");
  EXPECT_TRUE(f.chat_template.empty());
  EXPECT_EQ(tok->special_tokens().bos_id, -1);
}

// Every supported name gives a tokenizer.json whose regexes compile (the fixtures check
// the families' ids; "default" and the aliases have no published tokenizer.json).
TEST(GgufTokenizer, EverySupportedPreTokenizerLoads) {
  for (const char* pre : {"default", "gpt-2", "qwen2", "deepseek-r1-qwen", "llama-bpe", "llama3", "llama-v3",
                          "deepseek-llm", "deepseek-v3"}) {
    const auto f = files_of(bpe_kvs({{"tokenizer.ggml.pre", kv_str("tokenizer.ggml.pre", pre)}}));
    const auto tok = Tokenizer::from_json(f.tokenizer_json, f.tokenizer_config_json, kBad);
    EXPECT_EQ(tok->encode("ab<|x|>"), (std::vector<int32_t>{2, 3})) << pre;
  }
  // No tokenizer.ggml.pre: llama.cpp's "default".
  EXPECT_EQ(files_of(bpe_kvs({{"tokenizer.ggml.pre", ""}})).tokenizer_json,
            files_of(bpe_kvs({{"tokenizer.ggml.pre", kv_str("tokenizer.ggml.pre", "default")}})).tokenizer_json);
}

TEST(GgufTokenizer, AddBosAndEosBecomeTheTemplate) {
  const auto f = files_of(bpe_kvs({{"x1", kv_u32("tokenizer.ggml.bos_token_id", 3)},
                                   {"x2", kv_u32("tokenizer.ggml.eos_token_id", 4)},
                                   {"x3", kv_bool("tokenizer.ggml.add_bos_token", true)},
                                   {"x4", kv_bool("tokenizer.ggml.add_eos_token", true)}}));
  const auto tok = Tokenizer::from_json(f.tokenizer_json, f.tokenizer_config_json, kBad);
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{3, 2, 4}));
  EXPECT_EQ(tok->encode("ab", {.add_special_tokens = false}), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok->special_tokens().eos, "c");
}

TEST(GgufTokenizer, NamedChatTemplatesBecomeTheConfigList) {
  const auto f = files_of(bpe_kvs({{"t0", kv_str("tokenizer.chat_template", "{{ 'd' }}")},
                                   {"t1", kv_strs("tokenizer.chat_templates", {"tool_use"})},
                                   {"t2", kv_str("tokenizer.chat_template.tool_use", "{{ 't' }}")}}));
  EXPECT_EQ(f.chat_template, "{{ 'd' }}");
  const json want =
      json::parse(R"([{"name":"default","template":"{{ 'd' }}"},{"name":"tool_use","template":"{{ 't' }}"}])");
  EXPECT_EQ(json::parse(f.tokenizer_config_json)["chat_template"], want);
}

TEST(GgufTokenizer, SentencePieceWithoutSpacePrefix) {
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "\u2581", "a", "b", "ab", "\u2581a"};
  auto kvs = [&](bool prefix) {
    std::vector<std::string> v = {kv_str("tokenizer.ggml.model", "llama"), kv_strs("tokenizer.ggml.tokens", toks),
                                  kv_i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1}),
                                  kv_f32s("tokenizer.ggml.scores", {0, 0, 0, -5, -6, -7, -1, -2})};
    if (!prefix) v.push_back(kv_bool("tokenizer.ggml.add_space_prefix", false));
    return v;
  };
  for (bool prefix : {true, false}) {
    const auto f = files_of(kvs(prefix));
    const auto tok = Tokenizer::from_json(f.tokenizer_json, f.tokenizer_config_json, kBad);
    // llama.cpp's defaults with no ids in the file: <unk> 0, <s> 1, </s> 2, BOS added.
    EXPECT_EQ(tok->special_tokens().unk_id, 0);
    const std::vector<int32_t> want = prefix ? std::vector<int32_t>{1, 3, 6} : std::vector<int32_t>{1, 6};
    EXPECT_EQ(tok->encode("ab"), want);
    EXPECT_EQ(tok->decode(tok->encode("ab"), {.skip_special_tokens = true}), "ab");
  }
}

TEST(GgufTokenizer, BadMetadataIsAnErrorNamingFileAndKey) {
  const std::string T = "tokenizer.ggml.";
  expect_error(bpe_kvs({{T + "model", kv_str(T + "model", "bert")}}), {T + "model", "'bert'", "gpt2, llama"});
  expect_error(bpe_kvs({{T + "model", ""}}), {T + "model"});
  expect_error(bpe_kvs({{T + "model", kv_u32(T + "model", 2)}}), {T + "model"});
  expect_error(bpe_kvs({{T + "pre", kv_str(T + "pre", "mystery")}}), {T + "pre", "'mystery'", "qwen2", "deepseek-v3"});
  expect_error(bpe_kvs({{T + "tokens", ""}}), {T + "tokens"});
  expect_error(bpe_kvs({{T + "tokens", kv_i32s(T + "tokens", {1, 2})}}), {T + "tokens"});
  expect_error(bpe_kvs({{T + "token_type", kv_i32s(T + "token_type", {1, 1, 1})}}), {T + "token_type", "3", "5"});
  expect_error(bpe_kvs({{T + "token_type", kv_i32s(T + "token_type", {1, 1, 1, 9, 1})}}), {T + "token_type[3]", "9"});
  expect_error(bpe_kvs({{T + "tokens", kv_strs(T + "tokens", {"a", "b", "ab", "a", "c"})}}),
               {T + "tokens", "'a'", "0", "3"});
  expect_error(bpe_kvs({{T + "tokens", kv_strs(T + "tokens", {"a", "b", "ab", "\xff", "c"})}}),
               {T + "tokens[3]", "UTF-8"});
  expect_error(bpe_kvs({{T + "merges", ""}}), {T + "merges"});
  expect_error(bpe_kvs({{T + "merges", kv_strs(T + "merges", {"a b", "a q"})}}), {T + "merges[1]", "'q'"});
  expect_error(bpe_kvs({{T + "merges", kv_strs(T + "merges", {"ab"})}}), {T + "merges[0]", "space"});
  expect_error(bpe_kvs({{T + "merges", kv_strs(T + "merges", {"b a"})}}), {T + "merges[0]", "'ba'"});
  expect_error(bpe_kvs({{"x", kv_u32(T + "bos_token_id", 5)}}), {T + "bos_token_id", "5"});
  expect_error(bpe_kvs({{"x", kv_u32(T + "padding_token_id", 1u << 31)}}), {T + "padding_token_id"});
  expect_error(bpe_kvs({{"x", kv_bool(T + "add_bos_token", true)}}), {T + "add_bos_token", T + "bos_token_id"});
  expect_error(bpe_kvs({{"x", kv_strs("tokenizer.chat_templates", {"rag"})}}), {"tokenizer.chat_template.rag"});
  expect_error(bpe_kvs({{"x", kv_str("tokenizer.chat_template", "\xc3")}}), {"tokenizer.chat_template", "UTF-8"});

  // SentencePiece: scores are required, as long as the tokens, and finite.
  const std::vector<std::string> spm = {kv_str(T + "model", "llama"), kv_strs(T + "tokens", {"<unk>", "a", "b", "ab"})};
  auto with = [&](std::string extra) {
    auto v = spm;
    v.push_back(std::move(extra));
    return v;
  };
  expect_error(spm, {T + "scores"});
  expect_error(with(kv_f32s(T + "scores", {0, 0, 0})), {T + "scores", "3", "4"});
  expect_error(with(kv_f32s(T + "scores", {0, 0, 0, std::numeric_limits<float>::quiet_NaN()})), {T + "scores[3]"});
  expect_error(with(kv_strs(T + "scores", {"x", "y", "z", "w"})), {T + "scores"});
}

}  // namespace
