// The WordPiece and WordLevel models of `tokenizers` (src/models/wordpiece, wordlevel):
// WordPiece takes the longest vocabulary prefix, then the longest "##"-prefixed
// continuation, and turns the whole piece into unk when any part cannot be matched or
// the piece has more than max_input_chars_per_word characters; WordLevel maps a whole
// piece to its id or to unk.
#include "text/model.h"
#include "text/unicode.h"

namespace moe::text {

namespace {

using js::json;

class WordPiece final : public Model {
 public:
  Vocab vocab;
  std::string unk, prefix = "##";
  size_t max_chars = 100;

  std::optional<int32_t> token_to_id(std::string_view t) const override { return vocab.find(t); }
  const std::string* id_to_token(int32_t id) const override { return vocab.token(id); }
  size_t vocab_size() const override { return vocab.size(); }
  int64_t end_id() const override { return vocab.end_id(); }
  std::optional<std::string> unk_token() const override { return unk; }

  int32_t unk_id() const {
    auto id = vocab.find(unk);
    MOE_CHECK(id.has_value(), "WordPiece: unk_token '{}' is not in the vocabulary", unk);
    return *id;
  }

  void tokenize(std::string_view w, std::vector<int32_t>& out) const override {
    size_t nchars = 0;
    for (size_t i = 0; i < w.size(); i += uni::seq_len(static_cast<unsigned char>(w[i]))) ++nchars;
    if (nchars > max_chars) {
      out.push_back(unk_id());
      return;
    }
    const size_t before = out.size();
    std::string buf;
    size_t start = 0;
    while (start < w.size()) {
      size_t end = w.size();
      std::optional<int32_t> found;
      while (start < end) {
        std::string_view sub = w.substr(start, end - start);
        if (start > 0) {
          buf.assign(prefix);
          buf.append(sub);
          sub = buf;
        }
        if ((found = vocab.find(sub))) break;
        end = uni::prev_start(w, end);
      }
      if (!found) {
        out.resize(before);
        out.push_back(unk_id());
        return;
      }
      out.push_back(*found);
      start = end;
    }
  }
};

class WordLevel final : public Model {
 public:
  Vocab vocab;
  std::string unk;
  std::optional<int32_t> token_to_id(std::string_view t) const override { return vocab.find(t); }
  const std::string* id_to_token(int32_t id) const override { return vocab.token(id); }
  size_t vocab_size() const override { return vocab.size(); }
  int64_t end_id() const override { return vocab.end_id(); }
  std::optional<std::string> unk_token() const override { return unk; }
  void tokenize(std::string_view w, std::vector<int32_t>& out) const override {
    if (auto id = vocab.find(w)) {
      out.push_back(*id);
      return;
    }
    auto u = vocab.find(unk);
    MOE_CHECK(u.has_value(), "WordLevel: '{}' is not in the vocabulary and unk_token '{}' is missing too", w, unk);
    out.push_back(*u);
  }
};

}  // namespace

std::unique_ptr<Model> make_wordpiece(const json& j, const std::string& where, ParsedVocab* side) {
  auto m = std::make_unique<WordPiece>();
  m->unk = js::str_or(j, "unk_token", "[UNK]", where);
  m->prefix = js::str_or(j, "continuing_subword_prefix", "##", where);
  const int64_t mc = js::integer_or(j, "max_input_chars_per_word", 100, where);
  MOE_CHECK(mc >= 0, "{}: max_input_chars_per_word must not be negative", where);
  m->max_chars = static_cast<size_t>(mc);
  m->vocab.build(read_vocab_map(j, side, where + ".vocab"), where + ".vocab");
  return m;
}

std::unique_ptr<Model> make_wordlevel(const json& j, const std::string& where, ParsedVocab* side) {
  auto m = std::make_unique<WordLevel>();
  m->unk = js::str_or(j, "unk_token", "<unk>", where);
  m->vocab.build(read_vocab_map(j, side, where + ".vocab"), where + ".vocab");
  return m;
}

}  // namespace moe::text
