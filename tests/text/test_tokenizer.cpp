// Tokenizer goldens: every tokenizer under tests/fixtures/text/tokenizers/ is checked
// against its golden.json (written by tools/gen_text_fixtures.py from Hugging Face
// `tokenizers` / `sentencepiece`) on every corpus text and on the joined corpus: ids with
// and without special tokens, with special tokens read as text, decode with and without
// skip_special_tokens, round trip, token strings and incremental decoding.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using moe::text::DecodeOptions;
using moe::text::EncodeOptions;
using moe::text::IncrementalDecoder;
using moe::text::Tokenizer;

namespace {

const fs::path kTokDir = fs::path(MOE_FIXTURES_DIR) / "text" / "tokenizers";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> golden_names() {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(kTokDir, ec)) return out;
  for (const auto& e : fs::directory_iterator(kTokDir))
    if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = [] {
    const json j = json::parse(slurp(fs::path(MOE_FIXTURES_DIR) / "text" / "corpus.json"));
    return j.get<std::vector<std::string>>();
  }();
  return c;
}

std::string joined_corpus() {
  std::string s;
  for (size_t i = 0; i < corpus().size(); ++i) {
    if (i) s += '\n';
    s += corpus()[i];
  }
  return s;
}

bool valid_utf8(const std::string& s) {
  // Independent of the library: the standard well-formedness table.
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) n = 0;
    else if (b >= 0xC2 && b <= 0xDF) n = 1;
    else if (b >= 0xE0 && b <= 0xEF) { n = 2; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { n = 3; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else return false;
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return false;
    }
    i += n + 1;
  }
  return true;
}

struct Case {
  std::vector<int32_t> ids, ids_plain, ids_split;
  std::vector<std::string> tokens;
  std::string decode, decode_skip;
  bool roundtrip = false;
};

Case read_case(const json& c) {
  Case r;
  r.ids = c.at("ids").get<std::vector<int32_t>>();
  r.ids_plain = c.contains("ids_plain") ? c["ids_plain"].get<std::vector<int32_t>>() : r.ids;
  r.ids_split = c.contains("ids_split_special") ? c["ids_split_special"].get<std::vector<int32_t>>() : r.ids_plain;
  if (c.contains("tokens")) r.tokens = c["tokens"].get<std::vector<std::string>>();
  r.decode = c.at("decode").get<std::string>();
  r.decode_skip = c.contains("decode_skip") ? c["decode_skip"].get<std::string>() : r.decode;
  r.roundtrip = c.at("roundtrip").get<bool>();
  return r;
}

struct Loaded {
  std::unique_ptr<Tokenizer> tok;
  json golden;
  std::vector<Case> cases;
  Case joined;
};

const Loaded& load(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Loaded l;
  l.tok = Tokenizer::from_dir((kTokDir / name).string());
  l.golden = json::parse(slurp(kTokDir / name / "golden.json"));
  for (const auto& c : l.golden.at("cases")) l.cases.push_back(read_case(c));
  const json& jc = l.golden.at("joined");
  l.joined.ids = jc.at("ids").get<std::vector<int32_t>>();
  l.joined.decode = jc.at("decode").get<std::string>();
  l.joined.roundtrip = jc.at("roundtrip").get<bool>();
  return cache.emplace(name, std::move(l)).first->second;
}

std::string show(const std::string& s) { return json(s).dump(); }

class TokGolden : public ::testing::TestWithParam<std::string> {};

TEST(TokFixtures, DirectoryHasTokenizers) {
  ASSERT_TRUE(fs::is_directory(kTokDir)) << kTokDir << " is missing";
  EXPECT_FALSE(golden_names().empty()) << "no tokenizer with golden.json under " << kTokDir;
}

TEST(TokFixtures, EveryDirectoryLoads) {
  ASSERT_TRUE(fs::is_directory(kTokDir));
  for (const auto& e : fs::directory_iterator(kTokDir)) {
    if (!e.is_directory()) continue;
    EXPECT_NO_THROW(Tokenizer::from_dir(e.path().string())) << e.path();
  }
}

TEST_P(TokGolden, CorpusMatchesGolden) {
  const Loaded& l = load(GetParam());
  ASSERT_EQ(l.cases.size(), corpus().size());
  EXPECT_EQ(l.tok->vocab_size(), l.golden.at("vocab_size").get<int64_t>());
  int failures = 0;
  for (size_t i = 0; i < l.cases.size() && failures < 20; ++i) {
    const std::string& text = corpus()[i];
    const Case& c = l.cases[i];
    const auto ids = l.tok->encode(text);
    const auto plain = l.tok->encode(text, {.add_special_tokens = false});
    const auto split = l.tok->encode(text, {.add_special_tokens = false, .parse_special = false});
    const std::string dec = l.tok->decode(c.ids);
    const std::string dec_skip = l.tok->decode(c.ids, {.skip_special_tokens = true});
    const bool ok = ids == c.ids && plain == c.ids_plain && split == c.ids_split && dec == c.decode &&
                    dec_skip == c.decode_skip && (l.tok->decode(c.ids_plain) == text) == c.roundtrip;
    EXPECT_EQ(ids, c.ids) << "case " << i << " " << show(text);
    EXPECT_EQ(plain, c.ids_plain) << "case " << i << " " << show(text);
    EXPECT_EQ(split, c.ids_split) << "case " << i << " " << show(text);
    EXPECT_EQ(dec, c.decode) << "case " << i << " " << show(text);
    EXPECT_EQ(dec_skip, c.decode_skip) << "case " << i << " " << show(text);
    EXPECT_EQ(l.tok->decode(c.ids_plain) == text, c.roundtrip) << "case " << i << " " << show(text);
    if (c.roundtrip) {
      EXPECT_EQ(l.tok->decode(plain), text) << "case " << i;
    }
    if (!ok) ++failures;
  }
}

TEST_P(TokGolden, JoinedCorpusMatchesGolden) {
  const Loaded& l = load(GetParam());
  const std::string text = joined_corpus();
  EXPECT_EQ(l.tok->encode(text), l.joined.ids);
  EXPECT_EQ(l.tok->decode(l.joined.ids), l.joined.decode);
  EXPECT_EQ(l.tok->decode(l.tok->encode(text, {.add_special_tokens = false})) == text, l.joined.roundtrip);
}

TEST_P(TokGolden, TokenStrings) {
  const Loaded& l = load(GetParam());
  for (size_t i = 0; i < l.cases.size(); ++i) {
    const Case& c = l.cases[i];
    ASSERT_EQ(c.tokens.size(), c.ids.size());
    for (size_t k = 0; k < c.ids.size(); ++k) {
      const std::string t = l.tok->id_to_token(c.ids[k]);
      if (t == c.tokens[k]) continue;
      // Unigram reports the unknown text itself for unk.
      if (c.ids[k] == l.tok->special_tokens().unk_id) continue;
      // An lstrip/rstrip added token reports the matched span, whitespace included.
      EXPECT_NE(c.tokens[k].find(t), std::string::npos) << "case " << i << " id " << c.ids[k];
      EXPECT_TRUE(l.tok->token_to_id(t).has_value());
    }
    for (size_t k = 0; k < c.ids.size(); ++k) {
      const std::string t = l.tok->id_to_token(c.ids[k]);
      ASSERT_TRUE(l.tok->token_to_id(t).has_value()) << t;
    }
  }
}

TEST_P(TokGolden, IncrementalDecodeConcatenatesToDecode) {
  const Loaded& l = load(GetParam());
  for (bool skip : {false, true}) {
    for (size_t i = 0; i < l.cases.size(); ++i) {
      const Case& c = l.cases[i];
      IncrementalDecoder inc(*l.tok, {.skip_special_tokens = skip});
      std::string all;
      for (int32_t id : c.ids) {
        const std::string piece = inc.push(id);
        EXPECT_TRUE(valid_utf8(piece)) << "case " << i << " piece " << show(piece);
        all += piece;
      }
      all += inc.finish();
      EXPECT_EQ(all, skip ? c.decode_skip : c.decode) << "case " << i;
    }
  }
}

TEST_P(TokGolden, SpecialTokensAreConsistent) {
  const Loaded& l = load(GetParam());
  const auto& st = l.tok->special_tokens();
  auto check = [&](const std::string& s, int32_t id) {
    if (s.empty()) {
      EXPECT_EQ(id, -1);
      return;
    }
    auto t = l.tok->token_to_id(s);
    EXPECT_EQ(t.value_or(-1), id) << s;
  };
  check(st.bos, st.bos_id);
  check(st.eos, st.eos_id);
  check(st.unk, st.unk_id);
  check(st.pad, st.pad_id);
  // The BOS the post-processor adds is the one SpecialTokens names.
  for (const Case& c : l.cases) {
    if (c.ids.size() > c.ids_plain.size() && st.bos_id >= 0 && c.ids[0] != c.ids_plain[0]) {
      EXPECT_EQ(c.ids[0], st.bos_id);
      break;
    }
  }
}

TEST_P(TokGolden, DecodeOutOfRangeNamesTheId) {
  const Loaded& l = load(GetParam());
  const int64_t v = l.tok->vocab_size();
  for (int64_t bad : {v, v + 100, int64_t{-1}}) {
    try {
      l.tok->decode({0, static_cast<int32_t>(bad)});
      FAIL() << "no error for id " << bad;
    } catch (const moe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(l.tok->id_to_token(static_cast<int32_t>(v)), "");
}

INSTANTIATE_TEST_SUITE_P(Tok, TokGolden, ::testing::ValuesIn(golden_names()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TokGolden);

}  // namespace
