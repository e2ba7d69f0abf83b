// tokenizer.json "model": BPE (bpe.cpp), WordPiece and WordLevel (wordpiece.cpp), Unigram
// (unigram.cpp), each as `tokenizers` implements it (src/models/*). The vocabulary
// container enforces what the file must satisfy: ids unique, in [0, 2^31), at most
// kMaxVocabEntries entries.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/flat_map.h"
#include "text/json_util.h"

namespace moe::text {

// Bigger vocabularies are refused (the largest real ones are ~10^6): loading 10^7 entries
// would take gigabytes for no model we can run.
constexpr size_t kMaxVocabEntries = 4'000'000;

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

class Vocab {
 public:
  // Takes (token, id) pairs; a token appearing twice keeps its last id (as a JSON map
  // does). `where` names the file/field in errors.
  void build(std::vector<std::pair<std::string, int64_t>> entries, const std::string& where);
  std::optional<int32_t> find(std::string_view t) const {
    const int32_t* v = map_.find(t);
    if (!v) return std::nullopt;
    return *v;
  }
  const std::string* token(int32_t id) const;
  size_t size() const { return map_.size(); }
  int64_t end_id() const { return end_id_; }  // max id + 1 (0 when empty)

 private:
  FlatStrMap map_;
  std::vector<std::string> by_id_;  // dense ids
  std::vector<uint8_t> has_;
  std::unordered_map<int32_t, std::string> sparse_;  // used when ids are sparse
  int64_t end_id_ = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized piece.
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& out) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view t) const = 0;
  virtual const std::string* id_to_token(int32_t id) const = 0;
  // Model::get_vocab_size (number of entries): where new added tokens are numbered from.
  virtual size_t vocab_size() const = 0;
  virtual int64_t end_id() const = 0;  // max id + 1
  // The model's unk token, if it has one (for SpecialTokens).
  virtual std::optional<std::string> unk_token() const { return std::nullopt; }
};

// A {"token": id} vocabulary taken out of the JSON while it was parsed (hf_tokenizer.cpp
// does this so that a large vocabulary never becomes a std::map in the DOM); when
// `collected`, model.vocab in the DOM is an empty object and these are its entries.
struct ParsedVocab {
  bool collected = false;
  std::vector<std::pair<std::string, int64_t>> entries;
};

std::unique_ptr<Model> make_model(const js::json& j, const std::string& where, ParsedVocab* side = nullptr);

std::unique_ptr<Model> make_bpe(const js::json& j, const std::string& where, ParsedVocab* side);
std::unique_ptr<Model> make_wordpiece(const js::json& j, const std::string& where, ParsedVocab* side);
std::unique_ptr<Model> make_wordlevel(const js::json& j, const std::string& where, ParsedVocab* side);
std::unique_ptr<Model> make_unigram(const js::json& j, const std::string& where);

// The (token, id) pairs of the model's {"token": id, ...} vocabulary (from `side` when it
// was collected during parsing).
std::vector<std::pair<std::string, int64_t>> read_vocab_map(const js::json& model, ParsedVocab* side,
                                                            const std::string& where);

}  // namespace moe::text
