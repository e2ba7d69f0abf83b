// Bad input to the tokenizer: invalid UTF-8, broken or hostile tokenizer.json files,
// unsupported component types, bad ids. Every case must raise moe::Error whose message
// names the thing that was wrong (never crash, never silently succeed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using moe::text::Tokenizer;

namespace {

const fs::path kTokDir = fs::path(MOE_FIXTURES_DIR) / "text" / "tokenizers";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string& qwen3_text() {
  static const std::string s = slurp(kTokDir / "qwen3" / "tokenizer.json");
  return s;
}

// Runs f, expects moe::Error, and returns its message ("" and a failure otherwise).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const moe::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a moe::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error";
  return {};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string load_error(const json& j, const std::string& name = "mutated.json") {
  return error_of([&] { Tokenizer::from_json(j.dump(), {}, name); });
}

TEST(TokErrors, InvalidUtf8NamesTheOffset) {
  auto qwen = Tokenizer::from_dir((kTokDir / "qwen3").string());
  auto ernie = Tokenizer::from_dir((kTokDir / "ernie").string());
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"abc\xff", 3},          {"\x80", 0},
      {"ok \xC3", 3},          {"\xC0\xAF", 0},           // truncated, overlong
      {"x\xED\xA0\x80y", 1},   {"\xF4\x90\x80\x80", 0},   // surrogate, > U+10FFFF
      {"h\xC3\xA9llo\xE2\x82", 6}, {"\xF0\x9F\x98", 0}};
  for (const auto& item : bad) {
    const std::string& text = item.first;
    const size_t off = item.second;
    for (const Tokenizer* t : {qwen.get(), ernie.get()}) {
      const std::string msg = error_of([&] { t->encode(text); });
      EXPECT_TRUE(has(msg, "offset " + std::to_string(off))) << msg;
      EXPECT_TRUE(has(msg, "UTF-8")) << msg;
    }
  }
}

TEST(TokErrors, TruncatedJsonNamesTheFile) {
  const std::string& full = qwen3_text();
  for (size_t cut : {size_t{0}, size_t{1}, size_t{17}, full.size() / 5, full.size() / 2, full.size() * 9 / 10,
                     full.size() - 3}) {
    const std::string msg =
        error_of([&] { Tokenizer::from_json(std::string_view(full).substr(0, cut), {}, "qwen3/tokenizer.json"); });
    EXPECT_TRUE(has(msg, "qwen3/tokenizer.json")) << "cut " << cut << ": " << msg;
    EXPECT_TRUE(has(msg, "JSON")) << "cut " << cut << ": " << msg;
  }
  // A config that is not JSON.
  const std::string msg = error_of([&] { Tokenizer::from_json(full, "{\"add_bos_token\": tru", "q"); });
  EXPECT_TRUE(has(msg, "tokenizer_config.json")) << msg;
}

TEST(TokErrors, UnknownComponentTypesAreNamed) {
  const json base = json::parse(qwen3_text());
  struct Mut {
    const char* field;
    const char* type;
  };
  for (const Mut& m : {Mut{"model", "Transformer9000"}, Mut{"normalizer", "Sparkle"}, Mut{"pre_tokenizer", "Chop"},
                       Mut{"decoder", "Glue"}, Mut{"post_processor", "Wrap"}}) {
    json j = base;
    if (j[m.field].is_null()) j[m.field] = json::object();
    j[m.field]["type"] = m.type;
    const std::string msg = load_error(j, "typed.json");
    EXPECT_TRUE(has(msg, m.type)) << msg;
    EXPECT_TRUE(has(msg, "typed.json")) << msg;
    EXPECT_TRUE(has(msg, m.field)) << msg;
  }
  // Nested: a Sequence member.
  json j = base;
  j["pre_tokenizer"]["pretokenizers"][1]["type"] = "UnicodeScripts";
  EXPECT_TRUE(has(load_error(j), "UnicodeScripts"));
  j = base;
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", ""}};
  EXPECT_TRUE(has(load_error(j), "Precompiled"));
}

TEST(TokErrors, MergeWithMissingTokenIsNamed) {
  json j = json::parse(qwen3_text());
  j["model"]["merges"].push_back(json::array({"zzqx", "e"}));
  const std::string msg = load_error(j);
  EXPECT_TRUE(has(msg, "zzqx")) << msg;
  j = json::parse(qwen3_text());
  j["model"]["merges"].push_back("a b c");
  EXPECT_TRUE(has(load_error(j), "a b c"));
  // The merged result must exist too.
  j = json::parse(qwen3_text());
  j["model"]["vocab"]["qqq"] = 5000;
  j["model"]["vocab"]["jjj"] = 5001;
  j["model"]["merges"].push_back("qqq jjj");
  EXPECT_TRUE(has(load_error(j), "qqqjjj"));
}

TEST(TokErrors, VocabIdsMustBeUniqueAndInRange) {
  json j = json::parse(qwen3_text());
  const int64_t id = j["model"]["vocab"]["!"].get<int64_t>();
  j["model"]["vocab"]["\""] = id;
  std::string msg = load_error(j);
  EXPECT_TRUE(has(msg, "unique") && has(msg, std::to_string(id))) << msg;
  for (int64_t bad : {int64_t{-1}, int64_t{1} << 31, int64_t{1} << 40}) {
    j = json::parse(qwen3_text());
    j["model"]["vocab"]["!"] = bad;
    msg = load_error(j);
    EXPECT_TRUE(has(msg, std::to_string(bad))) << msg;
  }
  j = json::parse(qwen3_text());
  j["model"]["vocab"]["!"] = "zero";
  EXPECT_TRUE(has(load_error(j), "integer"));
}

TEST(TokErrors, HugeVocabularyFailsFastWithAClearError) {
  // 10^7 entries: refused (the limit is in the message) in bounded time and memory.
  std::string s = R"({"version":"1.0","model":{"type":"BPE","merges":[],"vocab":{)";
  s.reserve(200u << 20);
  char buf[32];
  for (int i = 0; i < 10'000'000; ++i) {
    const int n = std::snprintf(buf, sizeof buf, "%s\"t%d\":%d", i ? "," : "", i, i);
    s.append(buf, static_cast<size_t>(n));
  }
  s += "}}}";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { Tokenizer::from_json(s, {}, "huge.json"); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(msg, "4000000") && has(msg, "huge.json")) << msg;
  EXPECT_LT(secs, 60.0);
}

TEST(TokErrors, BadModelOptions) {
  json j = json::parse(qwen3_text());
  j["model"]["dropout"] = 0.1;
  EXPECT_TRUE(has(load_error(j), "dropout"));
  j = json::parse(qwen3_text());
  j.erase("model");
  EXPECT_TRUE(has(load_error(j), "model"));
  j = json::parse(qwen3_text());
  j["model"]["merges"] = 5;
  EXPECT_TRUE(has(load_error(j), "merges"));
  j = json::parse(qwen3_text());
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_TRUE(has(load_error(j), "(unclosed"));
  j = json::parse(qwen3_text());
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_TRUE(has(load_error(j), "Sideways"));
  j = json::parse(qwen3_text());
  j["version"] = "7.0";
  EXPECT_TRUE(has(load_error(j), "version"));
  j = json::parse(qwen3_text());
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({json{{"SpecialToken", {{"id", "<nope>"}, {"type_id", 0}}}}})},
                         {"special_tokens", json::object()}};
  EXPECT_TRUE(has(load_error(j), "<nope>"));
  // Unigram: unk_id outside the vocabulary.
  json u = json::parse(slurp(kTokDir / "unigram" / "tokenizer.json"));
  u["model"]["unk_id"] = 100000;
  EXPECT_TRUE(has(load_error(u), "100000"));
}

TEST(TokErrors, MissingFilesAreNamed) {
  const fs::path empty = fs::temp_directory_path() / "moe_tok_empty_dir";
  fs::create_directories(empty);
  const std::string msg = error_of([&] { Tokenizer::from_dir(empty.string()); });
  EXPECT_TRUE(has(msg, empty.string())) << msg;
  EXPECT_TRUE(has(error_of([&] { Tokenizer::from_json_file((empty / "nope.json").string()); }), "nope.json"));
  // A tokenizer.model that is not a SentencePiece model.
  { std::ofstream(empty / "tokenizer.model") << "definitely not protobuf"; }
  EXPECT_TRUE(has(error_of([&] { Tokenizer::from_dir(empty.string()); }), "tokenizer.model"));
  fs::remove_all(empty);
}

TEST(TokErrors, DecodeOutOfRangeSentencePiece) {
  auto t = Tokenizer::from_dir((kTokDir / "ernie").string());
  const auto v = static_cast<int32_t>(t->vocab_size());
  EXPECT_TRUE(has(error_of([&] { t->decode({1, v}); }), std::to_string(v)));
  EXPECT_TRUE(has(error_of([&] { t->decode({-5}); }), "-5"));
}

TEST(TokBehaviour, JsonFileWithoutConfigMatchesDirectory) {
  // qwen3's tokenizer_config.json changes nothing about encoding (golden: transformers and
  // tokenizers agree), so the bare tokenizer.json must give the same ids.
  auto dir = Tokenizer::from_dir((kTokDir / "qwen3").string());
  auto file = Tokenizer::from_json_file((kTokDir / "qwen3" / "tokenizer.json").string());
  const json corpus = json::parse(slurp(fs::path(MOE_FIXTURES_DIR) / "text" / "corpus.json"));
  for (const auto& c : corpus) {
    const std::string text = c.get<std::string>();
    EXPECT_EQ(dir->encode(text), file->encode(text));
  }
  EXPECT_EQ(dir->special_tokens().eos, "<|im_end|>");  // from the config
}

TEST(TokBehaviour, ConcurrentEncodeGivesTheSameIds) {
  const json corpus = json::parse(slurp(fs::path(MOE_FIXTURES_DIR) / "text" / "corpus.json"));
  for (const char* name : {"qwen3", "mixtral", "unigram", "ernie"}) {
    auto tok = Tokenizer::from_dir((kTokDir / name).string());
    std::vector<std::vector<int32_t>> want;
    for (const auto& c : corpus) want.push_back(tok->encode(c.get<std::string>()));
    std::vector<int> bad(4, 0);
    std::vector<std::thread> th;
    for (int t = 0; t < 4; ++t)
      th.emplace_back([&, t] {
        for (int rep = 0; rep < 3; ++rep)
          for (size_t i = 0; i < corpus.size(); ++i)
            if (tok->encode(corpus[(i + static_cast<size_t>(t) * 7) % corpus.size()].get<std::string>()) !=
                want[(i + static_cast<size_t>(t) * 7) % corpus.size()])
              ++bad[t];
      });
    for (auto& x : th) x.join();
    for (int b : bad) EXPECT_EQ(b, 0) << name;
  }
}

}  // namespace

namespace {

// Byte-fallback runs that turn invalid after being valid: ByteFallback decodes a run of
// <0xNN> tokens as a whole (one U+FFFD per byte when it is not UTF-8), so text of the run
// can change until a token that is not a byte ends it.
TEST(TokBehaviour, IncrementalDecodeOfInvalidByteRuns) {
  for (const char* name : {"mixtral", "ernie"}) {
    auto tok = Tokenizer::from_dir((kTokDir / name).string());
    auto byte = [&](int b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      auto id = tok->token_to_id(buf);
      EXPECT_TRUE(id.has_value()) << buf;
      return id.value_or(0);
    };
    const int32_t word = tok->encode("hello", {.add_special_tokens = false}).at(0);
    const std::vector<std::vector<int32_t>> seqs = {
        {byte(0xE4), byte(0xB8), byte(0xAD), byte(0xE4), word},          // valid char, then a stray lead byte
        {byte(0xE4), byte(0xB8), byte(0xAD), byte(0xE4)},                // ... at the very end
        {word, byte(0xF0), byte(0x9F), byte(0x98), byte(0x80), byte(0x80), word},  // emoji + stray continuation
        {byte(0xC3), byte(0xA9), word, byte(0xFF), byte(0xC3), byte(0xA9)},
        // A special token that skip_special_tokens drops does not end the run.
        {word, byte(0x62), byte(0x66), tok->special_tokens().unk_id, byte(0xFF)}};
    for (const auto& ids : seqs) {
      for (bool skip : {false, true}) {
        moe::text::IncrementalDecoder inc(*tok, {.skip_special_tokens = skip});
        std::string all;
        for (int32_t id : ids) {
          const std::string piece = inc.push(id);
          EXPECT_EQ(moe::text::uni::find_invalid_utf8(piece), std::string::npos) << "piece cuts a character";
          all += piece;
          EXPECT_TRUE(tok->decode(inc.ids(), {.skip_special_tokens = skip}).compare(0, all.size(), all) == 0)
              << name << ": emitted text is not a prefix of the decode";
        }
        all += inc.finish();
        EXPECT_EQ(all, tok->decode(ids, {.skip_special_tokens = skip})) << name;
      }
    }
  }
}

}  // namespace
