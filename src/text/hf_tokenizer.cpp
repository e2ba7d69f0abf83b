// The tokenizer.json Tokenizer: `tokenizers`' TokenizerImpl::encode / decode
// (src/tokenizer/mod.rs) over the components of normalizer.h, pre_tokenizer.h, model.h,
// post_processor.h, decoder.h and added_vocab.h, plus what transformers 5 does on top
// when a tokenizer_config.json is given (TokenizersBackend.__init__):
//  - added_tokens_decoder entries and named special tokens that the tokenizer.json lacks
//    are added;
//  - bos/eos/unk/pad strings come from it (SpecialTokens);
//  - add_bos_token / add_eos_token are ignored: transformers 5.24 drops them from the
//    config whenever there is a tokenizer.json (PreTrainedTokenizerBase._from_pretrained),
//    so the tokenizer.json post-processor decides BOS/EOS.
// truncation and padding of tokenizer.json are ignored (transformers turns them off for a
// plain `tokenizer(text)` call too).
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "text/added_vocab.h"
#include "text/decoder.h"
#include "text/model.h"
#include "text/normalizer.h"
#include "text/post_processor.h"
#include "text/pre_tokenizer.h"
#include "text/sp_tokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace moe::text {

namespace {

using js::json;

// One entry of tokenizer.json's "added_tokens" or tokenizer_config.json's
// "added_tokens_decoder" (the same fields in both; `normalized` defaults to !special,
// as in tokenizers).
AddedToken parse_added_token(const json& t, const std::string& w) {
  AddedToken a;
  a.content = js::str(t, "content", w);
  a.single_word = js::boolean_or(t, "single_word", false, w);
  a.lstrip = js::boolean_or(t, "lstrip", false, w);
  a.rstrip = js::boolean_or(t, "rstrip", false, w);
  a.special = js::boolean_or(t, "special", false, w);
  a.normalized = js::boolean_or(t, "normalized", !a.special, w);
  return a;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MOE_CHECK(f.good(), "cannot open {}", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  MOE_CHECK(!f.bad(), "error while reading {}", path);
  return ss.str();
}

bool file_exists(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return f.good();
}

// Parses tokenizer.json, taking the {"token": id} entries of model.vocab out of the DOM
// as they are read (a std::map node per entry would cost ~3x the time and memory) and
// refusing vocabularies past kMaxVocabEntries before they are all in memory.
json parse_tokenizer_json(std::string_view text, const std::string& name, ParsedVocab& side) {
  std::string key_at[4];
  bool in_vocab = false;
  std::string pending;
  size_t merges = 0;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    using E = json::parse_event_t;
    if (ev == E::key && depth >= 1 && depth <= 3) {
      key_at[depth] = parsed.get<std::string>();
      for (int d = depth + 1; d < 4; ++d) key_at[d].clear();
      if (depth == 3 && in_vocab) {
        pending = key_at[3];
        return false;  // keeps the key out of the DOM too (only the value would be dropped otherwise)
      }
      return true;
    }
    if (depth == 2 && key_at[1] == "model" && key_at[2] == "vocab") {
      if (ev == E::object_start) {
        in_vocab = true;
        side.collected = true;
        side.entries.clear();
      } else if (ev == E::object_end) {
        in_vocab = false;
      }
      return true;
    }
    if (in_vocab && depth == 3) {
      MOE_CHECK(ev == E::value && parsed.is_number_integer(), "{}: model.vocab entry '{}' must map to an integer id",
                name, pending);
      MOE_CHECK(side.entries.size() < kMaxVocabEntries,
                "{}: model.vocab has more than {} entries, the most this tokenizer loads", name, kMaxVocabEntries);
      const int64_t id = parsed.is_number_unsigned() && parsed.get<uint64_t>() > uint64_t{1} << 62
                             ? -1
                             : parsed.get<int64_t>();
      side.entries.emplace_back(std::move(pending), id);
      return false;  // not kept in the DOM
    }
    if (depth == 3 && key_at[1] == "model" && (key_at[2] == "merges" || key_at[2] == "vocab") &&
        (ev == E::value || ev == E::array_start || ev == E::object_start)) {
      MOE_CHECK(++merges <= 2 * kMaxVocabEntries, "{}: model.{} has more than {} entries, the most this tokenizer "
                "loads", name, key_at[2], 2 * kMaxVocabEntries);
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    MOE_FAIL("{}: not valid JSON: {}", name, e.what());
  }
}

// A special token in tokenizer_config.json: "str", {"content": "str", ...} or null.
std::optional<std::string> config_token(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object())
    if (const json* c = js::find(v, "content"); c && c->is_string()) return c->get<std::string>();
  return std::nullopt;
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(std::string_view json_text, std::string_view config_text, const std::string& name);

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt) const override;
  std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& opt) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto a = added_.token_to_id(token)) return a;
    return model_->token_to_id(token);
  }
  std::string id_to_token(int32_t id) const override {
    if (const AddedToken* t = added_.token(id)) return t->content;
    if (const std::string* s = model_->id_to_token(id)) return *s;
    return {};
  }
  bool is_special(int32_t id) const override {
    if (const AddedToken* t = added_.token(id)) return added_.is_special(t->content) || t->special;
    const std::string* s = model_->id_to_token(id);
    return s && added_.is_special(*s);
  }
  const SpecialTokens& special_tokens() const override { return special_; }

 private:
  void apply_config(const json& cfg, const std::string& where);

  std::string name_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PostProcessor> post_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  SpecialTokens special_;
  bool track_ = false;
  int64_t vocab_size_ = 0;
};

HfTokenizer::HfTokenizer(std::string_view json_text, std::string_view config_text, const std::string& name)
    : name_(name) {
  ParsedVocab side;
  const json j = parse_tokenizer_json(json_text, name, side);
  MOE_CHECK(j.is_object(), "{}: expected a JSON object at the top level", name);
  if (const json* v = js::find(j, "version"); v && !v->is_null())
    MOE_CHECK(v->is_string() && v->get<std::string>() == "1.0", "{}: unknown tokenizer.json version {}", name,
              v->dump());
  normalizer_ = make_normalizer(j.value("normalizer", json()), name + ": normalizer");
  pre_ = make_pre_tokenizer(j.value("pre_tokenizer", json()), name + ": pre_tokenizer");
  model_ = make_model(js::req(j, "model", name), name + ": model", &side);
  post_ = make_post_processor(j.value("post_processor", json()), name + ": post_processor");
  decoder_ = make_decoder(j.value("decoder", json()), name + ": decoder");
  track_ = pre_ && pre_->needs_offsets();

  if (const json* at = js::find(j, "added_tokens"); at && !at->is_null()) {
    MOE_CHECK(at->is_array(), "{}: 'added_tokens' must be a list", name);
    std::vector<AddedToken> tokens;
    for (size_t i = 0; i < at->size(); ++i) {
      const json& t = (*at)[i];
      const std::string w = fmt::format("{}: added_tokens[{}]", name, i);
      AddedToken a = parse_added_token(t, w);
      if (const json* id = js::find(t, "id"))
        MOE_CHECK(id->is_number_integer() && id->get<int64_t>() >= 0 && id->get<int64_t>() < (int64_t{1} << 31),
                  "{}: 'id' must be an integer in [0, 2^31)", w);
      tokens.push_back(std::move(a));
    }
    added_.add_tokens(tokens, *model_, normalizer_.get());
  }

  if (!config_text.empty()) {
    const std::string where = name + " (tokenizer_config.json)";
    json cfg;
    try {
      cfg = json::parse(config_text);
    } catch (const json::exception& e) {
      MOE_FAIL("{}: not valid JSON: {}", where, e.what());
    }
    MOE_CHECK(cfg.is_object(), "{}: expected a JSON object", where);
    apply_config(cfg, where);
  } else {
    std::vector<std::pair<std::string, int32_t>> front, back;
    if (post_) post_->added_tokens(front, back);
    if (!front.empty()) special_.bos = front[0].first;
    if (!back.empty()) special_.eos = back[0].first;
    if (auto u = model_->unk_token()) special_.unk = *u;
  }
  vocab_size_ = std::max(model_->end_id(), added_.end_id());
  if (post_) {
    // tokenizers adds these ids unchecked; an id past the vocabulary could not be decoded.
    std::vector<std::pair<std::string, int32_t>> front, back;
    post_->added_tokens(front, back);
    for (const auto* list : {&front, &back})
      for (const auto& [tok, id] : *list)
        MOE_CHECK(id < vocab_size_, "{}: post_processor adds token '{}' with id {}, outside the vocabulary [0, {})",
                  name, tok, id, vocab_size_);
  }
  auto id_of = [&](const std::string& s) { return s.empty() ? -1 : token_to_id(s).value_or(-1); };
  special_.bos_id = id_of(special_.bos);
  special_.eos_id = id_of(special_.eos);
  special_.unk_id = id_of(special_.unk);
  special_.pad_id = id_of(special_.pad);
}

void HfTokenizer::apply_config(const json& cfg, const std::string& where) {
  // Special token strings; a missing key falls back to the model / post-processor.
  std::vector<std::pair<std::string, int32_t>> front, back;
  if (post_) post_->added_tokens(front, back);
  auto named = [&](const char* key, std::string& out, const std::string& fallback) {
    if (const json* v = js::find(cfg, key)) {
      out = config_token(*v).value_or("");
    } else {
      out = fallback;
    }
  };
  named("bos_token", special_.bos, front.empty() ? "" : front[0].first);
  named("eos_token", special_.eos, back.empty() ? "" : back[0].first);
  named("unk_token", special_.unk, model_->unk_token().value_or(""));
  named("pad_token", special_.pad, "");

  // added_tokens_decoder entries that differ from what tokenizer.json declared, then the
  // named special tokens that are still missing (TokenizersBackend.__init__).
  std::vector<AddedToken> extra;
  if (const json* atd = js::find(cfg, "added_tokens_decoder"); atd && atd->is_object()) {
    std::vector<std::pair<int64_t, AddedToken>> items;
    for (auto it = atd->begin(); it != atd->end(); ++it) {
      const std::string w = fmt::format("{}: added_tokens_decoder['{}']", where, it.key());
      int64_t idx = 0;
      try {
        idx = std::stoll(it.key());
      } catch (...) {
        MOE_FAIL("{}: key must be a token id", w);
      }
      const json& t = it.value();
      AddedToken a = parse_added_token(t, w);
      items.emplace_back(idx, std::move(a));
    }
    std::sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto& [idx, a] : items) {
      auto id = added_.token_to_id(a.content);
      const AddedToken* have = id ? added_.token(*id) : nullptr;
      if (!have || !(*have == a)) extra.push_back(std::move(a));
    }
  }
  std::vector<std::string> named_specials;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (const json* v = js::find(cfg, key))
      if (auto s = config_token(*v)) named_specials.push_back(*s);
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"})
    if (const json* v = js::find(cfg, key); v && v->is_array())
      for (const json& e : *v)
        if (auto s = config_token(e)) named_specials.push_back(*s);
  for (const std::string& s : named_specials) {
    if (added_.token_to_id(s)) continue;
    bool queued = false;
    for (const auto& e : extra) queued = queued || e.content == s;
    if (queued) continue;
    AddedToken a;
    a.content = s;
    a.special = true;
    a.normalized = false;
    extra.push_back(std::move(a));
  }
  if (!extra.empty()) added_.add_tokens(extra, *model_, normalizer_.get());

}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const size_t bad = uni::find_invalid_utf8(text);
  MOE_CHECK(bad == std::string_view::npos, "encode: the text is not valid UTF-8 (invalid byte 0x{:02X} at byte offset {})",
            static_cast<unsigned char>(text[bad]), bad);
  Splits splits;
  added_.extract_and_normalize(text, normalizer_.get(), opt.parse_special, track_, splits);
  if (pre_) pre_->pre_tokenize(splits);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Split& s : splits) {
    if (s.id >= 0)
      ids.push_back(s.id);
    else
      model_->tokenize(s.text.get(), ids);
  }
  if (post_) post_->process(ids, opt.add_special_tokens);
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, const DecodeOptions& opt) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    MOE_CHECK(id >= 0 && id < vocab_size_, "decode: token id {} is out of range [0, {}) for {}", id, vocab_size_,
              name_);
    const std::string* t = added_.id_to_token(id);
    if (!t) t = model_->id_to_token(id);
    if (!t) continue;  // a hole in the ids: tokenizers skips it too
    if (opt.skip_special_tokens && added_.is_special(*t)) continue;
    tokens.push_back(*t);
  }
  if (decoder_) return decoder_->decode(std::move(tokens));
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) out += ' ';
    out += tokens[i];
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view json_text, std::string_view config_json,
                                                const std::string& name) {
  return std::make_unique<HfTokenizer>(json_text, config_json, name);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_file(const std::string& path) {
  return from_json(read_file(path), {}, path);
}

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  const std::string tj = base + "tokenizer.json", tc = base + "tokenizer_config.json", tm = base + "tokenizer.model";
  const std::string config = file_exists(tc) ? read_file(tc) : std::string();
  if (file_exists(tj)) return from_json(read_file(tj), config, tj);
  MOE_CHECK(file_exists(tm), "{}: no tokenizer.json or tokenizer.model in this directory", dir);
  return make_sentencepiece_tokenizer(read_file(tm), config, tm);
}

}  // namespace moe::text
