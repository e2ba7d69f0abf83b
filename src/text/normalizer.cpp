// See normalizer.h. Each class reproduces the `tokenizers` normalizer of the same name
// (src/normalizers/*.rs), including its order of operations (BertNormalizer: clean text,
// pad CJK, strip accents (defaulting to `lowercase`), lowercase).
#include "text/normalizer.h"

#include <vector>

namespace moe::text {

namespace {

using js::json;

class SequenceN final : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> items;
  void normalize(NormalizedString& s) const override {
    for (const auto& n : items) n->normalize(s);
  }
};

class UnicodeN final : public Normalizer {
 public:
  explicit UnicodeN(uni::NormForm f) : form(f) {}
  uni::NormForm form;
  void normalize(NormalizedString& s) const override { s.normalize(form); }
};

class LowercaseN final : public Normalizer {
 public:
  void normalize(NormalizedString& s) const override { s.lowercase(); }
};

class ReplaceN final : public Normalizer {
 public:
  ReplaceN(Pattern p, std::string c) : pat(std::move(p)), content(std::move(c)) {}
  Pattern pat;
  std::string content;
  void normalize(NormalizedString& s) const override { s.replace(pat, content); }
};

class PrependN final : public Normalizer {
 public:
  explicit PrependN(std::string p) : prefix(std::move(p)) {}
  std::string prefix;
  void normalize(NormalizedString& s) const override {
    if (!s.empty()) s.prepend(prefix);
  }
};

class StripN final : public Normalizer {
 public:
  bool left = false, right = false;
  void normalize(NormalizedString& s) const override {
    if (left) s.lstrip();
    if (right) s.rstrip();
  }
};

class StripAccentsN final : public Normalizer {
 public:
  void normalize(NormalizedString& s) const override {
    s.filter([](char32_t c) { return !uni::is_mark(c); });
  }
};

class NmtN final : public Normalizer {
 public:
  void normalize(NormalizedString& s) const override {
    s.filter([](char32_t c) {
      return !((c >= 0x1 && c <= 0x8) || c == 0xB || (c >= 0xE && c <= 0x1F) || c == 0x7F || c == 0x8F ||
               c == 0x9F);
    });
    s.map([](char32_t c) -> char32_t {
      switch (c) {
        case 0x9: case 0xA: case 0xC: case 0xD: case 0x1680: case 0x2028: case 0x2029: case 0x2581:
        case 0xFEFF: case 0xFFFD:
          return U' ';
        default:
          return (c >= 0x200B && c <= 0x200F) ? U' ' : c;
      }
    });
  }
};

class ByteLevelN final : public Normalizer {
 public:
  void normalize(NormalizedString& s) const override {
    if (!s.empty()) s.byte_level();
  }
};

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertN final : public Normalizer {
 public:
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;
  void normalize(NormalizedString& s) const override {
    if (clean_text) {
      s.filter([](char32_t c) { return !uni::is_bert_control(c); });
      s.map([](char32_t c) -> char32_t {
        const bool ws = c == '\t' || c == '\n' || c == '\r' || uni::is_whitespace(c);
        return ws ? U' ' : c;
      });
    }
    if (chinese) {
      const std::string& t = s.get();
      bool any = false;
      for (size_t i = 0; i < t.size() && !any;) any = is_chinese_char(uni::next_cp(t, i));
      if (any) {
        std::vector<NormalizedString::Edit> edits;
        for (size_t i = 0; i < t.size();) {
          const char32_t c = uni::next_cp(t, i);
          if (is_chinese_char(c)) {
            edits.emplace_back(U' ', 0);
            edits.emplace_back(c, 1);
            edits.emplace_back(U' ', 1);
          } else {
            edits.emplace_back(c, 0);
          }
        }
        s.transform(edits, 0);
      }
    }
    if (strip_accents) {
      s.normalize(uni::NormForm::NFD);
      s.filter([](char32_t c) { return !uni::is_mark_nonspacing(c); });
    }
    if (lowercase) s.lowercase();
  }
};

Pattern parse_pattern(const json& j, const std::string& where) {
  const json& p = js::req(j, "pattern", where);
  MOE_CHECK(p.is_object() && p.size() == 1, "{}: 'pattern' must be {{\"String\": ...}} or {{\"Regex\": ...}}",
            where);
  if (const json* s = js::find(p, "String")) {
    MOE_CHECK(s->is_string(), "{}: pattern.String must be a string", where);
    return Pattern::literal(s->get<std::string>());
  }
  if (const json* r = js::find(p, "Regex")) {
    MOE_CHECK(r->is_string(), "{}: pattern.Regex must be a string", where);
    try {
      return Pattern::regex(r->get<std::string>());
    } catch (const Error& e) {
      MOE_FAIL("{}: {}", where, e.what());
    }
  }
  MOE_FAIL("{}: 'pattern' must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
}

}  // namespace

Pattern parse_split_pattern(const json& j, const std::string& where) { return parse_pattern(j, where); }

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = js::type_of(j, where);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceN>();
    const json& list = js::arr(j, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
      MOE_CHECK(n != nullptr, "{}.normalizers[{}]: null normalizer in a Sequence", where, i);
      seq->items.push_back(std::move(n));
    }
    return seq;
  }
  if (type == "NFC") return std::make_unique<UnicodeN>(uni::NormForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeN>(uni::NormForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeN>(uni::NormForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeN>(uni::NormForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseN>();
  if (type == "Replace") return std::make_unique<ReplaceN>(parse_pattern(j, where), js::str(j, "content", where));
  if (type == "Prepend") return std::make_unique<PrependN>(js::str(j, "prepend", where));
  if (type == "Strip") {
    auto s = std::make_unique<StripN>();
    s->left = js::boolean_or(j, "strip_left", false, where);
    s->right = js::boolean_or(j, "strip_right", false, where);
    return s;
  }
  if (type == "StripAccents") return std::make_unique<StripAccentsN>();
  if (type == "Nmt") return std::make_unique<NmtN>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelN>();
  if (type == "BertNormalizer") {
    auto b = std::make_unique<BertN>();
    b->clean_text = js::boolean_or(j, "clean_text", true, where);
    b->chinese = js::boolean_or(j, "handle_chinese_chars", true, where);
    b->lowercase = js::boolean_or(j, "lowercase", true, where);
    b->strip_accents = js::boolean_or(j, "strip_accents", b->lowercase, where);
    return b;
  }
  MOE_FAIL("{}: unsupported normalizer type '{}' (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
           "Replace, Prepend, Strip, StripAccents, Nmt, ByteLevel, BertNormalizer)",
           where, type);
}

}  // namespace moe::text
