// See pre_tokenizer.h. Every pre-tokenizer maps each piece that is not an added token to
// sub-pieces (PreTokenizedString::split drops the empty ones), exactly as in `tokenizers`.
#include "text/pre_tokenizer.h"

#include "text/normalizer.h"

namespace moe::text {

namespace {

using js::json;

template <class F>
void split_each(Splits& splits, F fn) {
  Splits out;
  out.reserve(splits.size() * 2);
  std::vector<NormalizedString> pieces;
  for (auto& sp : splits) {
    if (sp.id >= 0) {
      out.push_back(std::move(sp));
      continue;
    }
    pieces.clear();
    fn(sp.text, pieces);
    for (auto& p : pieces)
      if (!p.empty()) out.push_back({std::move(p), -1});
  }
  splits.swap(out);
}

template <class Pred>
void split_chars(Splits& splits, Pred pred, SplitBehavior b) {
  std::vector<Pattern::Piece> m;
  split_each(splits, [&](NormalizedString& s, std::vector<NormalizedString>& out) {
    char_matches(s.get(), pred, m);
    s.split(m, b, out);
  });
}

class SequenceP final : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> items;
  void pre_tokenize(Splits& s) const override {
    for (const auto& p : items) p->pre_tokenize(s);
  }
  bool needs_offsets() const override {
    for (const auto& p : items)
      if (p->needs_offsets()) return true;
    return false;
  }
};

class SplitP final : public PreTokenizer {
 public:
  SplitP(Pattern p, SplitBehavior b, bool inv) : pat(std::move(p)), behavior(b), invert(inv) {}
  Pattern pat;
  SplitBehavior behavior;
  bool invert;
  void pre_tokenize(Splits& splits) const override {
    std::vector<Pattern::Piece> m;
    split_each(splits, [&](NormalizedString& s, std::vector<NormalizedString>& out) {
      pat.find_matches(s.get(), m);
      if (invert)
        for (auto& p : m) p.match = !p.match;
      s.split(m, behavior, out);
    });
  }
};

const Regex& gpt2_regex() {
  static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  return re;
}

class ByteLevelP final : public PreTokenizer {
 public:
  bool add_prefix_space = true, use_regex = true;
  void pre_tokenize(Splits& splits) const override {
    std::vector<std::pair<size_t, size_t>> found;
    std::vector<Pattern::Piece> m;
    split_each(splits, [&](NormalizedString& s, std::vector<NormalizedString>& out) {
      if (add_prefix_space && !s.empty() && s.get()[0] != ' ') s.prepend(" ");
      if (!use_regex) {
        out.push_back(std::move(s));
        return;
      }
      gpt2_regex().find_all(s.get(), found);
      m.clear();
      size_t prev = 0;
      for (auto [a, b] : found) {
        if (prev != a) m.push_back({prev, a, false});
        m.push_back({a, b, true});
        prev = b;
      }
      if (prev != s.get().size()) m.push_back({prev, s.get().size(), false});
      s.split(m, SplitBehavior::Isolated, out);
    });
    for (auto& sp : splits)
      if (sp.id < 0) sp.text.byte_level();
  }
};

enum class Prepend { First, Never, Always };

class MetaspaceP final : public PreTokenizer {
 public:
  char32_t replacement = 0x2581;
  std::string rep;
  Prepend scheme = Prepend::Always;
  bool split = true;
  bool needs_offsets() const override { return scheme == Prepend::First; }
  void pre_tokenize(Splits& splits) const override {
    std::vector<Pattern::Piece> m;
    split_each(splits, [&](NormalizedString& s, std::vector<NormalizedString>& out) {
      s.replace_char(U' ', rep);
      const bool starts = s.get().compare(0, rep.size(), rep) == 0;
      if (scheme == Prepend::Always && !starts) s.prepend(rep);
      if (scheme == Prepend::First && !starts && s.original_start() == 0) s.prepend(rep);
      if (!split) {
        out.push_back(std::move(s));
        return;
      }
      const char32_t r = replacement;
      char_matches(s.get(), [r](char32_t c) { return c == r; }, m);
      s.split(m, SplitBehavior::MergedWithNext, out);
    });
  }
};

class WhitespaceP final : public PreTokenizer {
 public:
  // \w+|[^\w\s]+ with the regex crate's Unicode classes: maximal runs of word chars or of
  // other non-space chars; whitespace is dropped.
  void pre_tokenize(Splits& splits) const override {
    std::vector<Pattern::Piece> m;
    split_each(splits, [&](NormalizedString& s, std::vector<NormalizedString>& out) {
      const std::string& t = s.get();
      m.clear();
      size_t i = 0, prev = 0;
      while (i < t.size()) {
        size_t j = i;
        const char32_t c = uni::next_cp(t, j);
        if (uni::is_whitespace(c) && !uni::is_word_char(c)) {
          i = j;
          continue;
        }
        const bool word = uni::is_word_char(c);
        size_t end = j;
        while (end < t.size()) {
          size_t k = end;
          const char32_t d = uni::next_cp(t, k);
          const bool w = uni::is_word_char(d);
          if (w != word || (!w && uni::is_whitespace(d))) break;
          end = k;
        }
        if (prev != i) m.push_back({prev, i, true});  // inverted: gaps are removed
        m.push_back({i, end, false});
        prev = end;
        i = end;
      }
      if (prev != t.size()) m.push_back({prev, t.size(), true});
      s.split(m, SplitBehavior::Removed, out);
    });
  }
};

class WhitespaceSplitP final : public PreTokenizer {
 public:
  void pre_tokenize(Splits& splits) const override {
    split_chars(splits, uni::is_whitespace, SplitBehavior::Removed);
  }
};

class DigitsP final : public PreTokenizer {
 public:
  bool individual = false;
  void pre_tokenize(Splits& splits) const override {
    split_chars(splits, uni::is_numeric, individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
};

class PunctuationP final : public PreTokenizer {
 public:
  SplitBehavior behavior = SplitBehavior::Isolated;
  void pre_tokenize(Splits& splits) const override { split_chars(splits, uni::is_punctuation, behavior); }
};

class BertP final : public PreTokenizer {
 public:
  void pre_tokenize(Splits& splits) const override {
    split_chars(splits, uni::is_whitespace, SplitBehavior::Removed);
    split_chars(splits, uni::is_punctuation, SplitBehavior::Isolated);
  }
};

class CharDelimiterP final : public PreTokenizer {
 public:
  char32_t delim = 0;
  void pre_tokenize(Splits& splits) const override {
    const char32_t d = delim;
    split_chars(splits, [d](char32_t c) { return c == d; }, SplitBehavior::Removed);
  }
};

class FixedLengthP final : public PreTokenizer {
 public:
  size_t length = 5;
  void pre_tokenize(Splits& splits) const override {
    split_each(splits, [&](NormalizedString& s, std::vector<NormalizedString>& out) {
      const std::string& t = s.get();
      size_t i = 0;
      while (i < t.size()) {
        const size_t b = i;
        for (size_t k = 0; k < length && i < t.size(); ++k) uni::next_cp(t, i);
        out.push_back(s.slice(b, i));
      }
    });
  }
};

}  // namespace

SplitBehavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  MOE_FAIL("{}: unknown split behavior '{}' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
           "Contiguous)",
           where, s);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = js::type_of(j, where);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceP>();
    const json& list = js::arr(j, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      MOE_CHECK(p != nullptr, "{}.pretokenizers[{}]: null pre-tokenizer in a Sequence", where, i);
      seq->items.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "Split") {
    return std::make_unique<SplitP>(parse_split_pattern(j, where),
                                    parse_behavior(js::str(j, "behavior", where), where),
                                    js::boolean_or(j, "invert", false, where));
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevelP>();
    b->add_prefix_space = js::boolean_or(j, "add_prefix_space", true, where);
    b->use_regex = js::boolean_or(j, "use_regex", true, where);
    return b;
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspaceP>();
    m->replacement = js::single_char(j, "replacement", where);
    m->rep = uni::to_utf8(m->replacement);
    const std::string scheme = js::str_or(j, "prepend_scheme", "always", where);
    if (scheme == "always")
      m->scheme = Prepend::Always;
    else if (scheme == "first")
      m->scheme = Prepend::First;
    else if (scheme == "never")
      m->scheme = Prepend::Never;
    else
      MOE_FAIL("{}: unknown Metaspace prepend_scheme '{}' (expected always, first or never)", where, scheme);
    // Files written before prepend_scheme existed say add_prefix_space: false for "never".
    if (const json* a = js::find(j, "add_prefix_space"); a && a->is_boolean() && !a->get<bool>()) {
      // As tokenizers: a missing prepend_scheme defaults to "always", which contradicts it.
      MOE_CHECK(m->scheme == Prepend::Never, "{}: add_prefix_space does not match declared prepend_scheme",
                where);
    }
    m->split = js::boolean_or(j, "split", true, where);
    return m;
  }
  if (type == "Whitespace") return std::make_unique<WhitespaceP>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitP>();
  if (type == "Digits") {
    auto d = std::make_unique<DigitsP>();
    d->individual = js::boolean_or(j, "individual_digits", false, where);
    return d;
  }
  if (type == "Punctuation") {
    auto p = std::make_unique<PunctuationP>();
    p->behavior = parse_behavior(js::str_or(j, "behavior", "Isolated", where), where);
    return p;
  }
  if (type == "BertPreTokenizer") return std::make_unique<BertP>();
  if (type == "CharDelimiterSplit") {
    auto c = std::make_unique<CharDelimiterP>();
    c->delim = js::single_char(j, "delimiter", where);
    return c;
  }
  if (type == "FixedLength") {
    auto f = std::make_unique<FixedLengthP>();
    const int64_t n = js::integer_or(j, "length", 5, where);
    MOE_CHECK(n > 0, "{}: FixedLength length must be positive, got {}", where, n);
    f->length = static_cast<size_t>(n);
    return f;
  }
  MOE_FAIL("{}: unsupported pre_tokenizer type '{}' (supported: Sequence, Split, ByteLevel, Metaspace, Digits, "
           "Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit, FixedLength)",
           where, type);
}

}  // namespace moe::text
