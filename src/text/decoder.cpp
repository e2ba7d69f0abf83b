// See decoder.h; each class follows the `tokenizers` decoder of the same name
// (src/decoders/*.rs, ByteLevel and Metaspace in src/pre_tokenizers). Invalid UTF-8 that a
// decoder produces becomes U+FFFD as String::from_utf8_lossy makes it (ByteLevel), or one
// U+FFFD per byte (ByteFallback, which uses String::from_utf8 and replaces every byte of
// an invalid run).
#include "text/decoder.h"

#include "text/normalizer.h"
#include "text/unicode.h"

namespace moe::text {

namespace {

using js::json;
using Tokens = std::vector<std::string>;

class SequenceD final : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> items;
  void decode_chain(Tokens& t) const override {
    for (const auto& d : items) d->decode_chain(t);
  }
};

class ByteLevelD final : public Decoder {
 public:
  void decode_chain(Tokens& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t before = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        const int b = uni::cp_to_byte(uni::next_cp(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!ok) {
        bytes.resize(before);
        bytes += t;  // a char outside the byte table: the token's own bytes
      }
    }
    tokens.assign(1, uni::from_utf8_lossy(bytes));
  }
};

class ByteFallbackD final : public Decoder {
 public:
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
      const char c = t[k];
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else return -1;
      v = v * 16 + d;
    }
    return v;
  }
  void decode_chain(Tokens& tokens) const override {
    Tokens out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (uni::find_invalid_utf8(pending) == std::string::npos)
        out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (auto& t : tokens) {
      const int b = byte_of(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens.swap(out);
  }
};

class FuseD final : public Decoder {
 public:
  void decode_chain(Tokens& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripD final : public Decoder {
 public:
  char32_t content = U' ';
  size_t start = 0, stop = 0;
  void decode_chain(Tokens& tokens) const override {
    for (auto& t : tokens) {
      std::u32string chars;
      for (size_t i = 0; i < t.size();) chars.push_back(uni::next_cp(t, i));
      size_t a = 0;
      for (size_t i = 0; i < start && i < chars.size(); ++i) {
        if (chars[i] != content) break;
        a = i + 1;
      }
      size_t b = chars.size();
      // The Rust loop indexes past the front when stop > len (a panic); stop at 0 here.
      for (size_t i = 0; i < stop && i < chars.size(); ++i) {
        const size_t idx = chars.size() - i - 1;
        if (chars[idx] != content) break;
        b = idx;
      }
      std::string r;
      for (size_t i = a; i < b; ++i) uni::append_utf8(r, chars[i]);
      t = std::move(r);
    }
  }
};

class ReplaceD final : public Decoder {
 public:
  ReplaceD(Pattern p, std::string c) : pat(std::move(p)), content(std::move(c)) {}
  Pattern pat;
  std::string content;
  void decode_chain(Tokens& tokens) const override {
    std::vector<Pattern::Piece> m;
    for (auto& t : tokens) {
      pat.find_matches(t, m);
      std::string r;
      for (const auto& p : m) {
        if (p.match)
          r += content;
        else
          r.append(t, p.start, p.end - p.start);
      }
      t = std::move(r);
    }
  }
};

class MetaspaceD final : public Decoder {
 public:
  char32_t replacement = 0x2581;
  bool prepend = true;  // prepend_scheme != never
  void decode_chain(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string r;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        const size_t b = k;
        const char32_t c = uni::next_cp(t, k);
        if (c == replacement) {
          if (!(i == 0 && prepend)) r.push_back(' ');
        } else {
          r.append(t, b, k - b);
        }
      }
      tokens[i] = std::move(r);
    }
  }
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (s.find(from) == std::string::npos) return;
  std::string r;
  size_t pos = 0;
  for (size_t f; (f = s.find(from, pos)) != std::string::npos; pos = f + from.size()) {
    r.append(s, pos, f - pos);
    r += to;
  }
  r.append(s, pos, std::string::npos);
  s = std::move(r);
}

// tokenizers' decoders::wordpiece::cleanup.
void cleanup(std::string& s) {
  replace_all(s, " .", ".");
  replace_all(s, " ?", "?");
  replace_all(s, " !", "!");
  replace_all(s, " ,", ",");
  replace_all(s, " ' ", "'");
  replace_all(s, " n't", "n't");
  replace_all(s, " 'm", "'m");
  replace_all(s, " do not", " don't");
  replace_all(s, " 's", "'s");
  replace_all(s, " 've", "'ve");
  replace_all(s, " 're", "'re");
}

class WordPieceD final : public Decoder {
 public:
  std::string prefix = "##";
  bool clean = true;
  void decode_chain(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.compare(0, prefix.size(), prefix) == 0)
          t.erase(0, prefix.size());
        else
          t = " " + t;
      }
      if (clean) cleanup(t);
    }
  }
};

class BPED final : public Decoder {
 public:
  std::string suffix = "</w>";
  void decode_chain(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (!suffix.empty()) replace_all(tokens[i], suffix, i + 1 == tokens.size() ? "" : " ");
  }
};

class CTCD final : public Decoder {
 public:
  std::string pad = "<pad>", delim = "|";
  bool clean = true;
  void decode_chain(Tokens& tokens) const override {
    Tokens out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 && tokens[i] == tokens[i - 1]) continue;  // dedup
      std::string r = tokens[i];
      if (!pad.empty()) replace_all(r, pad, "");
      if (clean) {
        cleanup(r);
        if (!delim.empty()) replace_all(r, delim, " ");
      }
      if (!r.empty()) out.push_back(std::move(r));
    }
    tokens.swap(out);
  }
};

bool metaspace_prepends(const json& j, const std::string& where) {
  const std::string scheme = js::str_or(j, "prepend_scheme", "always", where);
  MOE_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
            "{}: unknown Metaspace prepend_scheme '{}' (expected always, first or never)", where, scheme);
  if (const json* a = js::find(j, "add_prefix_space"); a && a->is_boolean() && !a->get<bool>())
    MOE_CHECK(scheme == "never", "{}: add_prefix_space does not match declared prepend_scheme", where);
  return scheme != "never";
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = js::type_of(j, where);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceD>();
    const json& list = js::arr(j, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto d = make_decoder(list[i], fmt::format("{}.decoders[{}]", where, i));
      MOE_CHECK(d != nullptr, "{}.decoders[{}]: null decoder in a Sequence", where, i);
      seq->items.push_back(std::move(d));
    }
    return seq;
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelD>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackD>();
  if (type == "Fuse") return std::make_unique<FuseD>();
  if (type == "Strip") {
    auto s = std::make_unique<StripD>();
    s->content = js::single_char(j, "content", where);
    const int64_t a = js::integer_or(j, "start", 0, where), b = js::integer_or(j, "stop", 0, where);
    MOE_CHECK(a >= 0 && b >= 0, "{}: Strip start/stop must not be negative", where);
    s->start = static_cast<size_t>(a);
    s->stop = static_cast<size_t>(b);
    return s;
  }
  if (type == "Replace") return std::make_unique<ReplaceD>(parse_split_pattern(j, where), js::str(j, "content", where));
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspaceD>();
    m->replacement = js::single_char(j, "replacement", where);
    m->prepend = metaspace_prepends(j, where);
    return m;
  }
  if (type == "WordPiece") {
    auto w = std::make_unique<WordPieceD>();
    w->prefix = js::str_or(j, "prefix", "##", where);
    w->clean = js::boolean_or(j, "cleanup", true, where);
    return w;
  }
  if (type == "BPEDecoder") {
    auto b = std::make_unique<BPED>();
    b->suffix = js::str_or(j, "suffix", "</w>", where);
    return b;
  }
  if (type == "CTC") {
    auto c = std::make_unique<CTCD>();
    c->pad = js::str_or(j, "pad_token", "<pad>", where);
    c->delim = js::str_or(j, "word_delimiter_token", "|", where);
    c->clean = js::boolean_or(j, "cleanup", true, where);
    return c;
  }
  MOE_FAIL("{}: unsupported decoder type '{}' (supported: Sequence, ByteLevel, ByteFallback, Fuse, Strip, "
           "Replace, Metaspace, WordPiece, BPEDecoder, CTC)",
           where, type);
}

}  // namespace moe::text
