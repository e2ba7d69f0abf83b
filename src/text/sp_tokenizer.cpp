// See sp_tokenizer.h.
#include "text/sp_tokenizer.h"

#include <sentencepiece_processor.h>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "text/unicode.h"

namespace moe::text {

namespace {

using json = nlohmann::json;

std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::string();  // null: no such token
}

class SpTokenizer final : public Tokenizer {
 public:
  SpTokenizer(std::string_view model, std::string_view config_text, const std::string& name) : name_(name) {
    const auto st = sp_.LoadFromSerializedProto(model);
    MOE_CHECK(st.ok(), "{}: not a SentencePiece model: {}", name, st.ToString());
    size_ = sp_.GetPieceSize();
    json cfg = json::object();
    if (!config_text.empty()) {
      try {
        cfg = json::parse(config_text);
      } catch (const json::exception& e) {
        MOE_FAIL("{} (tokenizer_config.json): not valid JSON: {}", name, e.what());
      }
      MOE_CHECK(cfg.is_object(), "{} (tokenizer_config.json): expected a JSON object", name);
    }
    auto flag = [&](const char* key) {
      auto it = cfg.find(key);
      return it != cfg.end() && it->is_boolean() && it->get<bool>();
    };
    add_bos_ = flag("add_bos_token");
    add_eos_ = flag("add_eos_token");
    auto piece = [&](int id) { return id >= 0 && id < size_ ? sp_.IdToPiece(id) : std::string(); };
    special_.bos = config_token(cfg, "bos_token").value_or(piece(sp_.bos_id()));
    special_.eos = config_token(cfg, "eos_token").value_or(piece(sp_.eos_id()));
    special_.unk = config_token(cfg, "unk_token").value_or(piece(sp_.unk_id()));
    special_.pad = config_token(cfg, "pad_token").value_or(piece(sp_.pad_id()));
    auto id_of = [&](const std::string& s) { return s.empty() ? -1 : token_to_id(s).value_or(-1); };
    special_.bos_id = id_of(special_.bos);
    special_.eos_id = id_of(special_.eos);
    special_.unk_id = id_of(special_.unk);
    special_.pad_id = id_of(special_.pad);
    MOE_CHECK(!add_bos_ || special_.bos_id >= 0, "{}: add_bos_token is set but there is no BOS token", name);
    MOE_CHECK(!add_eos_ || special_.eos_id >= 0, "{}: add_eos_token is set but there is no EOS token", name);
  }

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt) const override {
    const size_t bad = uni::find_invalid_utf8(text);
    MOE_CHECK(bad == std::string_view::npos,
              "encode: the text is not valid UTF-8 (invalid byte 0x{:02X} at byte offset {})",
              static_cast<unsigned char>(text[bad]), bad);
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    MOE_CHECK(st.ok(), "{}: SentencePiece encode failed: {}", name_, st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (opt.add_special_tokens && add_bos_) out.push_back(special_.bos_id);
    out.insert(out.end(), ids.begin(), ids.end());
    if (opt.add_special_tokens && add_eos_) out.push_back(special_.eos_id);
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& opt) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (int32_t id : ids) {
      MOE_CHECK(id >= 0 && id < size_, "decode: token id {} is out of range [0, {}) for {}", id, size_, name_);
      if (opt.skip_special_tokens && is_special(id)) continue;
      v.push_back(id);
    }
    std::string out;
    const auto st = sp_.Decode(v, &out);
    MOE_CHECK(st.ok(), "{}: SentencePiece decode failed: {}", name_, st.ToString());
    return out;
  }

  int64_t vocab_size() const override { return size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    if (id < 0 || id >= size_) return std::nullopt;
    // PieceToId answers unk_id for pieces it does not know.
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::string id_to_token(int32_t id) const override {
    return id >= 0 && id < size_ ? sp_.IdToPiece(id) : std::string();
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < size_ && (sp_.IsControl(id) || sp_.IsUnknown(id));
  }
  const SpecialTokens& special_tokens() const override { return special_; }

 private:
  std::string name_;
  sentencepiece::SentencePieceProcessor sp_;
  int size_ = 0;
  bool add_bos_ = false, add_eos_ = false;
  SpecialTokens special_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(std::string_view model_bytes, std::string_view config_json,
                                                        const std::string& name) {
  return std::make_unique<SpTokenizer>(model_bytes, config_json, name);
}

}  // namespace moe::text
