// tokenizer.ggml.* -> tokenizer.json / tokenizer_config.json (see gguf_tokenizer.h).
//
// Key conventions (gguf-py's constants, llama.cpp's llama-vocab.cpp):
//   tokenizer.ggml.model        "gpt2" | "llama" (others: bert, t5, rwkv, ... unsupported)
//   tokenizer.ggml.pre          pre-tokenizer name (BPE only; llama.cpp ignores it for "llama")
//   tokenizer.ggml.tokens       string[n], the token of each id
//   tokenizer.ggml.token_type   i32[n]: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
//   tokenizer.ggml.scores       f32[n] (or i32[n]): SentencePiece scores
//   tokenizer.ggml.merges       string[m], "left right" (split at the first space past byte 0)
//   tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token, add_eos_token,
//   add_space_prefix, tokenizer.chat_template (+ tokenizer.chat_templates and
//   tokenizer.chat_template.<name> for named ones).
#include "loader/gguf/gguf_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace moe::gguf {

namespace {

using json = nlohmann::ordered_json;

enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Bytes of the UTF-8 sequence starting with lead byte c, or 0 if c cannot start one.
int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// JSON strings must be UTF-8, and the GGUF reader hands strings out as raw bytes.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = utf8_len(c);
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

std::string utf8(char32_t cp) {
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  const int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  std::string s(static_cast<size_t>(n), '\0');
  for (int k = n - 1; k > 0; --k, cp >>= 6) s[k] = static_cast<char>(0x80 | (cp & 0x3F));
  s[0] = static_cast<char>(((0xF00 >> n) & 0xFF) | cp);  // n leading ones, then the high bits
  return s;
}

// "[a-bc...]": a regex character class written out as the published tokenizer.json
// writes it (literal characters, single ones without a dash), from code point ranges, so
// that look-alike characters (K and the Kelvin sign, Ω and the Ohm sign) cannot be mixed up.
std::string char_class(std::initializer_list<std::pair<char32_t, char32_t>> ranges) {
  std::string s = "[";
  for (auto [lo, hi] : ranges) s += lo == hi ? utf8(lo) : utf8(lo) + "-" + utf8(hi);
  return s + "]";
}

// ---- pre-tokenizers: the normalizer and pre_tokenizer of each family's tokenizer.json ----

json split(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json sequence(std::vector<json> pre) { return {{"type", "Sequence"}, {"pretokenizers", std::move(pre)}}; }

// Qwen2's and Llama 3's: one regex, differing in how many digits a number piece holds.
std::string qwen_llama_regex(const char* digits) {
  return std::string(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})") + digits +
         R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}

struct PreSpec {
  json normalizer;  // null when none
  json pre_tokenizer;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default when the file has no add_bos_token
};

std::optional<PreSpec> pre_spec(const std::string& pre) {
  if (pre == "qwen2" || pre == "deepseek-r1-qwen")  // Qwen2/2.5/3/3-MoE tokenizer.json
    return PreSpec{{{"type", "NFC"}}, sequence({split(qwen_llama_regex("")), byte_level(false)})};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3")  // Meta-Llama-3 tokenizer.json
    return PreSpec{nullptr, sequence({split(qwen_llama_regex("{1,3}")), byte_level(false)}), true, true};
  if (pre == "deepseek-v3") {  // DeepSeek-V3 / R1 tokenizer.json
    const std::string cjk = char_class({{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}}) + "+";
    const std::string rest =
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    return PreSpec{nullptr, sequence({split(R"(\p{N}{1,3})"), split(cjk), split(rest), byte_level(false)})};
  }
  if (pre == "deepseek-llm") {  // deepseek-llm-7b tokenizer.json (DeepSeek-V2 has the same)
    // clang-format off
    const std::string letters = char_class({
        {'A', 'Z'}, {'a', 'z'}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
        {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x376}, {0x377, 0x377}, {0x37B, 0x37D},
        {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5},
        {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
        {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A},
        {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
        {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
        {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
        {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
        {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124},
        {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139},
        {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2183}, {0x2184, 0x2184},
        {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF2}, {0x2CF3, 0x2CF3},
        {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E},
        {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A},
        {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2},
        {0x118A0, 0x118DF}, {0x1E900, 0x1E943}});
    // clang-format on
    const std::string punct =
        char_class({{'!', '/'}, {':', '~'}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}});
    const std::string cjk = char_class({{0x4E00, 0x9FA5}, {0x800, 0x4E00}, {0xAC00, 0xD7FF}});
    return PreSpec{json{{"type", "Sequence"}, {"normalizers", json::array()}},
                   sequence({split("[\r\n]"),
                             split(R"(\s?)" + letters + "+"),
                             split(R"(\s?)" + punct + "+"),
                             split(R"(\s+$)"),
                             split(cjk + "+"),
                             {{"type", "Digits"}, {"individual_digits", true}},
                             byte_level(false)})};
  }
  if (pre == "gpt-2")  // GPT-2's tokenizer.json: the ByteLevel pre-tokenizer's own regex
    return PreSpec{nullptr, byte_level(true)};
  if (pre == "default") {
    // No published tokenizer.json: llama.cpp's regexes for a BPE file of unknown
    // family, applied one after the other (its unicode_regex_split), i.e. Isolated Splits.
    return PreSpec{nullptr,
                   sequence({split(R"([\p{P}\$\+<=>\^~\|]+)"),
                             split(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))"),
                             split(R"(\p{N}+)"), split("[0-9][0-9][0-9]"), byte_level(false)})};
  }
  return std::nullopt;
}

constexpr const char* kSupportedPre =
    "default, gpt-2, qwen2, deepseek-r1-qwen, llama-bpe, llama3, llama-v3, "
    "deepseek-llm, deepseek-v3";

// ---- the vocabulary ----

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::unordered_map<std::string_view, int32_t> ids;  // views of `tokens`

  std::optional<int32_t> find(std::string_view t) const {
    auto it = ids.find(t);
    if (it == ids.end()) return std::nullopt;
    return it->second;
  }
};

Vocab read_vocab(const Metadata& md, const std::string& file) {
  Vocab v;
  v.tokens = md.get_str_array("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  MOE_CHECK(n > 0 && n < (size_t{1} << 31),
            "gguf file '{}': tokenizer.ggml.tokens has {} tokens, expected 1 to 2^31 - 1", file, n);
  // No token_type: every token is normal, as in llama.cpp.
  v.types = md.opt_i32_array("tokenizer.ggml.token_type").value_or(std::vector<int32_t>(n, kNormal));
  MOE_CHECK(v.types.size() == n,
            "gguf file '{}': tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}", file,
            v.types.size(), n);
  v.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    MOE_CHECK(v.types[i] >= kNormal && v.types[i] <= kByte,
              "gguf file '{}': tokenizer.ggml.token_type[{}] is {}, not a token type (1 normal ... 6 byte)", file, i,
              v.types[i]);
    std::string& t = v.tokens[i];
    if (t.empty()) t = "[EMPTY_" + std::to_string(i) + "]";  // llama.cpp's name for an empty token
    MOE_CHECK(valid_utf8(t), "gguf file '{}': tokenizer.ggml.tokens[{}] is not valid UTF-8", file, i);
    auto [it, fresh] = v.ids.emplace(t, static_cast<int32_t>(i));
    MOE_CHECK(fresh, "gguf file '{}': tokenizer.ggml.tokens has '{}' twice (ids {} and {})", file, t, it->second, i);
  }
  return v;
}

// tokenizer.ggml.merges, each "left right" split at the first space after byte 0 (a
// left part may itself be a space), every part and the merged token in the vocabulary.
std::vector<std::pair<std::string, std::string>> read_merges(const Metadata& md, const Vocab& v,
                                                             const std::string& file) {
  const char* key = "tokenizer.ggml.merges";
  auto lines = md.opt_str_array(key);
  MOE_CHECK(lines.has_value(), "gguf file '{}': {} is missing; a 'gpt2' tokenizer needs its merges", file, key);
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(lines->size());
  for (size_t i = 0; i < lines->size(); ++i) {
    const std::string& m = (*lines)[i];
    MOE_CHECK(valid_utf8(m), "gguf file '{}': {}[{}] is not valid UTF-8", file, key, i);
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    MOE_CHECK(sp != std::string::npos && sp + 1 < m.size(),
              "gguf file '{}': {}[{}] '{}' is not two tokens separated by a space", file, key, i, m);
    std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    for (const std::string* t : {&a, &b})
      MOE_CHECK(v.find(*t), "gguf file '{}': {}[{}] '{}' names '{}', which is not in tokenizer.ggml.tokens", file, key,
                i, m, *t);
    MOE_CHECK(v.find(a + b), "gguf file '{}': {}[{}] '{}' makes '{}', which is not in tokenizer.ggml.tokens", file, key,
              i, m, a + b);
    out.emplace_back(std::move(a), std::move(b));
  }
  return out;
}

// SentencePiece files have no merges: transformers' generate_merges (what its
// LlamaConverter puts in tokenizer.json) derives them from the scores: every split of a
// piece into two pieces of the vocabulary, ordered by the piece's score, then the
// lengths in code points of the left and right part (all descending), ties in piece id
// order and, within a piece, by the parts' ids. Only normal pieces are merge results:
// sentencepiece never builds control, unknown, byte, unused or user-defined pieces by
// merging.
std::vector<std::pair<std::string, std::string>> derive_merges(const Metadata& md, const Vocab& v,
                                                               const std::string& file) {
  const char* key = "tokenizer.ggml.scores";
  const Value* sv = md.find(key);
  MOE_CHECK(sv, "gguf file '{}': {} is missing; a 'llama' (SentencePiece) tokenizer needs its scores", file, key);
  std::vector<float> scores;
  if (sv->is_array() && sv->elem_type == ValueType::I32) {  // llama.cpp accepts integer scores too
    for (int32_t s : md.get_i32_array(key)) scores.push_back(static_cast<float>(s));
  } else {
    scores = md.get_f32_array(key);
  }
  MOE_CHECK(scores.size() == v.tokens.size(), "gguf file '{}': {} has {} entries but tokenizer.ggml.tokens has {}",
            file, key, scores.size(), v.tokens.size());
  struct Cand {
    float score;
    int32_t len_l, len_r, left, right;
  };
  std::vector<Cand> cands;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.types[id] != kNormal) continue;
    MOE_CHECK(std::isfinite(scores[id]), "gguf file '{}': {}[{}] is {}, not a finite number", file, key, id,
              scores[id]);
    const std::string& piece = v.tokens[id];
    const size_t first = cands.size();
    int32_t cps = 0, total = 0;
    for (size_t i = 0; i < piece.size(); i += utf8_len(static_cast<unsigned char>(piece[i]))) ++total;
    for (size_t i = 0; i < piece.size();) {
      i += utf8_len(static_cast<unsigned char>(piece[i]));
      ++cps;
      if (i >= piece.size()) break;
      auto l = v.find(std::string_view(piece).substr(0, i));
      auto r = v.find(std::string_view(piece).substr(i));
      if (l && r) cands.push_back({scores[id], cps, total - cps, *l, *r});
    }
    std::sort(cands.begin() + first, cands.end(),
              [](const Cand& a, const Cand& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(cands.size());
  for (const Cand& c : cands) out.emplace_back(v.tokens[c.left], v.tokens[c.right]);
  return out;
}

// ---- assembling the files ----

// model.vocab and model.merges are written as text: a vocabulary of 10^5 entries through
// a DOM would cost far more, and this keeps the ids in order.
std::string model_text(json opts, const Vocab& v, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::string s = opts.dump();
  s.pop_back();  // the closing brace
  s += ",\"vocab\":{";
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (i) s += ',';
    s += json(v.tokens[i]).dump() + ":" + std::to_string(i);
  }
  s += "},\"merges\":[";
  for (size_t i = 0; i < merges.size(); ++i) {
    if (i) s += ',';
    s += json::array({merges[i].first, merges[i].second}).dump();
  }
  return s + "]}";
}

json added_tokens(const Vocab& v) {
  json out = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t t = v.types[i];
    if (t != kControl && t != kUnknown && t != kUserDefined) continue;
    out.push_back({{"id", i},
                   {"content", v.tokens[i]},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", t != kUserDefined}});
  }
  return out;
}

json template_processing(const std::string* bos, int32_t bos_id, const std::string* eos, int32_t eos_id) {
  auto piece = [](const std::string& tok, int type_id) {
    return json{{"SpecialToken", {{"id", tok}, {"type_id", type_id}}}};
  };
  auto seq = [](const char* id, int type_id) { return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  json single = json::array(), pair = json::array(), specials = json::object();
  for (int part = 0; part < 2; ++part) {
    if (bos) pair.push_back(piece(*bos, part));
    pair.push_back(seq(part ? "B" : "A", part));
    if (eos) pair.push_back(piece(*eos, part));
  }
  if (bos) single.push_back(piece(*bos, 0));
  single.push_back(seq("A", 0));
  if (eos) single.push_back(piece(*eos, 0));
  if (bos) specials[*bos] = {{"id", *bos}, {"ids", json::array({bos_id})}, {"tokens", json::array({*bos})}};
  if (eos) specials[*eos] = {{"id", *eos}, {"ids", json::array({eos_id})}, {"tokens", json::array({*eos})}};
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

std::string checked_str(const Metadata& md, const std::string& key, const std::string& file) {
  std::string s = md.get_str(key);
  MOE_CHECK(valid_utf8(s), "gguf file '{}': {} is not valid UTF-8", file, key);
  return s;
}

}  // namespace

TokenizerFiles tokenizer_files(const Metadata& md, const std::string& file) {
  const std::string model = md.get_str("tokenizer.ggml.model");
  MOE_CHECK(model == "gpt2" || model == "llama",
            "gguf file '{}': unknown tokenizer.ggml.model '{}' (supported: gpt2, llama)", file, model);
  const bool spm = model == "llama";
  std::optional<PreSpec> pre;
  if (!spm) {
    const std::string name = md.opt_str("tokenizer.ggml.pre").value_or("default");  // llama.cpp's fallback too
    pre = pre_spec(name);
    MOE_CHECK(pre.has_value(), "gguf file '{}': unknown tokenizer.ggml.pre '{}' (supported: {})", file, name,
              kSupportedPre);
  }
  const Vocab v = read_vocab(md, file);
  const int64_t n = static_cast<int64_t>(v.tokens.size());

  // Special token ids; SentencePiece files fall back to llama.cpp's defaults (<unk> 0,
  // <s> 1, </s> 2) where those exist.
  auto special = [&](const char* what, int32_t fallback) -> std::optional<int32_t> {
    const std::string key = fmt::format("tokenizer.ggml.{}_token_id", what);
    if (auto id = md.opt_u32(key)) {
      MOE_CHECK(*id < n, "gguf file '{}': {} is {}, outside the vocabulary of {} tokens", file, key, *id, n);
      return static_cast<int32_t>(*id);
    }
    if (spm && fallback >= 0 && fallback < n) return fallback;
    return std::nullopt;
  };
  const auto bos = special("bos", 1), eos = special("eos", 2), unk = special("unknown", 0),
             pad = special("padding", -1);
  // llama.cpp's defaults: SentencePiece and Llama 3 add BOS (when there is one), nothing
  // adds EOS; only a file that asks for a token it does not name is an error.
  const bool add_bos = md.opt_bool("tokenizer.ggml.add_bos_token").value_or((spm || pre->add_bos) && bos);
  const bool add_eos = md.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);
  MOE_CHECK(!add_bos || bos,
            "gguf file '{}': tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is not set", file);
  MOE_CHECK(!add_eos || eos,
            "gguf file '{}': tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is not set", file);
  auto tok = [&](const std::optional<int32_t>& id) { return id ? json(v.tokens[*id]) : json(nullptr); };

  json opts = {{"type", "BPE"},
               {"dropout", nullptr},
               {"unk_token", nullptr},
               {"continuing_subword_prefix", nullptr},
               {"end_of_word_suffix", nullptr},
               {"fuse_unk", false},
               {"byte_fallback", false},
               {"ignore_merges", false}};
  json normalizer, pre_tokenizer, decoder;
  std::vector<std::pair<std::string, std::string>> merges;
  if (spm) {
    // transformers' LlamaConverter (legacy): "▁" before every piece of text between
    // added tokens (llama.cpp's add_space_prefix after each special token), spaces as "▁".
    const bool prefix = md.opt_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
    const json prepend = {{"type", "Prepend"}, {"prepend", "\u2581"}};
    normalizer = prefix ? json{{"type", "Sequence"}, {"normalizers", json::array({prepend, replace})}} : replace;
    json decoders = json::array({json{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                 json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}});
    if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    decoder = {{"type", "Sequence"}, {"decoders", decoders}};
    opts["unk_token"] = tok(unk);
    opts["fuse_unk"] = true;
    opts["byte_fallback"] = true;
    merges = derive_merges(md, v, file);
  } else {
    normalizer = pre->normalizer;
    pre_tokenizer = pre->pre_tokenizer;
    decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    opts["ignore_merges"] = pre->ignore_merges;
    merges = read_merges(md, v, file);
  }
  json post = nullptr;
  if (add_bos || add_eos)
    post = template_processing(add_bos ? &v.tokens[*bos] : nullptr, add_bos ? *bos : -1,
                               add_eos ? &v.tokens[*eos] : nullptr, add_eos ? *eos : -1);

  TokenizerFiles out;
  out.tokenizer_json =
      "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":" + added_tokens(v).dump() +
      ",\"normalizer\":" + normalizer.dump() + ",\"pre_tokenizer\":" + pre_tokenizer.dump() +
      ",\"post_processor\":" + post.dump() + ",\"decoder\":" + decoder.dump() +
      ",\"model\":" + model_text(opts, v, merges) + "}";

  json cfg = {{"add_bos_token", add_bos}, {"add_eos_token", add_eos}, {"bos_token", tok(bos)},
              {"eos_token", tok(eos)},    {"unk_token", tok(unk)},    {"pad_token", tok(pad)}};
  if (md.contains("tokenizer.chat_template")) out.chat_template = checked_str(md, "tokenizer.chat_template", file);
  // Named templates (gguf-py writes a list-valued chat_template this way): the config's
  // list form, "default" first.
  if (auto names = md.opt_str_array("tokenizer.chat_templates"); names && !names->empty()) {
    json list = json::array();
    if (md.contains("tokenizer.chat_template")) list.push_back({{"name", "default"}, {"template", out.chat_template}});
    for (const std::string& name : *names) {
      MOE_CHECK(valid_utf8(name), "gguf file '{}': a name in tokenizer.chat_templates is not valid UTF-8", file);
      const std::string key = "tokenizer.chat_template." + name;
      MOE_CHECK(md.contains(key), "gguf file '{}': tokenizer.chat_templates names '{}' but {} is missing", file, name,
                key);
      list.push_back({{"name", name}, {"template", checked_str(md, key, file)}});
    }
    cfg["chat_template"] = std::move(list);
  } else if (md.contains("tokenizer.chat_template")) {
    cfg["chat_template"] = out.chat_template;
  }
  out.tokenizer_config_json = cfg.dump();
  return out;
}

}  // namespace moe::gguf
