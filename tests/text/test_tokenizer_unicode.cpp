// Character data against HF `tokenizers` for every code point
// (tests/fixtures/text/extra_unicode.json, from tools/gen_unicode_tables.py): the class
// sets (punctuation, numeric, \w, Bert control, Mn, combining marks), one-char
// NFC/NFD/NFKC/NFKD/lowercase results hashed per 4096-code-point block, and random
// multi-character strings (marks, Hangul jamo, scripts newer than tokenizers' tables)
// through each normaliser. Also UTF-8 validation / lossy decoding properties.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/normalized.h"
#include "text/unicode.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
namespace uni = moe::text::uni;
using moe::text::NormalizedString;

namespace {

const json& golden() {
  static const json j = [] {
    std::ifstream f(fs::path(MOE_FIXTURES_DIR) / "text" / "extra_unicode.json", std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

bool surrogate(uint32_t c) { return c >= 0xD800 && c <= 0xDFFF; }

std::string lower(const std::string& s) {
  NormalizedString n(s, false);
  n.lowercase();
  return n.get();
}

TEST(TokUnicode, ClassesMatchTokenizersForEveryCodePoint) {
  const json& classes = golden().at("classes");
  const std::vector<std::pair<const char*, bool (*)(char32_t)>> preds = {
      {"kPunct", uni::is_punctuation},    {"kNumeric", uni::is_numeric},   {"kWord", uni::is_word_char},
      {"kBertControl", uni::is_bert_control}, {"kMn", uni::is_mark_nonspacing}, {"kCombining", uni::is_mark}};
  for (const auto& [name, pred] : preds) {
    std::vector<bool> want(0x110000, false);
    for (const auto& r : classes.at(name))
      for (uint32_t c = r[0]; c <= r[1].get<uint32_t>(); ++c) want[c] = true;
    int bad = 0;
    for (uint32_t c = 0; c < 0x110000; ++c) {
      if (surrogate(c) || want[c] == pred(c)) continue;
      if (++bad <= 5) ADD_FAILURE() << name << " differs at U+" << std::hex << c;
    }
    EXPECT_EQ(bad, 0) << name;
  }
}

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char b : s) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

TEST(TokUnicode, OneCharNormalisationMatchesTokenizersPerBlock) {
  const json& hashes = golden().at("block_hashes");
  const uint32_t block = golden().at("block").get<uint32_t>();
  const std::vector<std::pair<const char*, std::function<std::string(const std::string&)>>> forms = {
      {"nfc", [](const std::string& s) { return uni::normalize(s, uni::NormForm::NFC); }},
      {"nfd", [](const std::string& s) { return uni::normalize(s, uni::NormForm::NFD); }},
      {"nfkc", [](const std::string& s) { return uni::normalize(s, uni::NormForm::NFKC); }},
      {"nfkd", [](const std::string& s) { return uni::normalize(s, uni::NormForm::NFKD); }},
      {"lowercase", lower}};
  for (const auto& [name, fn] : forms) {
    const json& h = hashes.at(name);
    for (uint32_t b = 0; b * block < 0x110000; ++b) {
      uint64_t v = 0xCBF29CE484222325ull;
      for (uint32_t c = b * block; c < (b + 1) * block; ++c) {
        if (surrogate(c)) continue;
        v = fnv1a(fn(uni::to_utf8(c)) + std::string(1, '\0'), v);
      }
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
      EXPECT_EQ(buf, h.at(b).get<std::string>()) << name << " block U+" << std::hex << b * block;
    }
  }
}

TEST(TokUnicode, RandomStringsNormaliseLikeTokenizers) {
  for (const auto& s : golden().at("strings")) {
    const std::string t = s.at("text").get<std::string>();
    const std::string show = json(t).dump();
    EXPECT_EQ(uni::normalize(t, uni::NormForm::NFC), s.at("nfc").get<std::string>()) << show;
    EXPECT_EQ(uni::normalize(t, uni::NormForm::NFD), s.at("nfd").get<std::string>()) << show;
    EXPECT_EQ(uni::normalize(t, uni::NormForm::NFKC), s.at("nfkc").get<std::string>()) << show;
    EXPECT_EQ(uni::normalize(t, uni::NormForm::NFKD), s.at("nfkd").get<std::string>()) << show;
    EXPECT_EQ(lower(t), s.at("lowercase").get<std::string>()) << show;
    // With alignment tracking the text must come out the same.
    NormalizedString n(t, true);
    n.normalize(uni::NormForm::NFKD);
    EXPECT_EQ(n.get(), s.at("nfkd").get<std::string>()) << show;
  }
}

TEST(TokUnicode, Utf8ValidationAndLossyDecoding) {
  // Every well-formed sequence round-trips; lossy decoding of valid text is the identity.
  for (uint32_t c = 0; c < 0x110000; c += 97) {
    if (surrogate(c)) continue;
    const std::string s = uni::to_utf8(c);
    EXPECT_EQ(uni::find_invalid_utf8(s), std::string::npos);
    size_t i = 0;
    EXPECT_EQ(uni::next_cp(s, i), c);
    EXPECT_EQ(i, s.size());
    EXPECT_EQ(uni::from_utf8_lossy(s), s);
  }
  // Maximal subparts (Unicode 15 table 3-8 example: one U+FFFD per maximal subpart).
  const std::string bad = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(uni::from_utf8_lossy(bad), "a" + fffd + fffd + fffd + "b" + fffd + "c" + fffd + fffd + "d");
  EXPECT_EQ(uni::find_invalid_utf8(bad), 1u);
  // Every byte maps through the ByteLevel table and back.
  for (int b = 0; b < 256; ++b) EXPECT_EQ(uni::cp_to_byte(uni::byte_to_cp(static_cast<uint8_t>(b))), b);
}

}  // namespace
