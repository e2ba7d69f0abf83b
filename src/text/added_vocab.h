// Added tokens, as `tokenizers`' AddedVocabulary (src/tokenizer/added_vocabulary.rs):
//  - ids: a token already in the model vocabulary keeps its model id, a new one gets the
//    next id after max(model vocab size, largest added id);
//  - matching: tokens with normalized=false are found in the raw text first, then each
//    remaining piece is normalised and tokens with normalized=true are found in it (their
//    pattern is their normalised content); leftmost-longest, non-overlapping;
//  - flags: single_word (no word character right before / after), lstrip / rstrip
//    (swallow the whitespace before / after), special (skipped when special tokens are
//    not parsed, and in decode with skip_special_tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/model.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"

namespace moe::text {

struct AddedToken {
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  bool operator==(const AddedToken&) const = default;
};

class AddedVocabulary {
 public:
  // AddedVocabulary::add_tokens for one batch (ids numbered as described above).
  void add_tokens(const std::vector<AddedToken>& tokens, const Model& model, const Normalizer* norm);

  // AddedVocabulary::extract_and_normalize: the text split into added tokens (id >= 0)
  // and normalised pieces still to pre-tokenize.
  void extract_and_normalize(std::string_view text, const Normalizer* norm, bool parse_special, bool track,
                             Splits& out) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  // simple_id_to_token: the normalised content for normalized tokens.
  const std::string* id_to_token(int32_t id) const;
  const AddedToken* token(int32_t id) const;
  bool is_special(std::string_view content) const { return special_.count(std::string(content)) != 0; }
  int64_t end_id() const { return max_id_ + 1; }
  bool empty() const { return by_id_.empty(); }
  const std::unordered_map<int32_t, AddedToken>& tokens() const { return by_id_; }

 private:
  struct Matcher {
    // Byte trie with leftmost-longest search.
    struct Node {
      std::unordered_map<unsigned char, int32_t> kids;
      int32_t value = -1;
    };
    std::vector<Node> nodes{1};
    bool first_byte[256] = {};
    bool empty = true;
    void add(std::string_view pattern, int32_t id);
    // (start, end, id) of successive matches.
    void find(std::string_view s, std::vector<std::tuple<size_t, size_t, int32_t>>& out) const;
  };
  void refresh();
  // find_matches: (id or -1, start, end) pieces covering s.
  void find_matches(std::string_view s, const Matcher& m, bool parse_special,
                    std::vector<std::tuple<int32_t, size_t, size_t>>& out) const;

  TokenMap map_;                                   // content -> id
  std::unordered_map<int32_t, AddedToken> by_id_;  // id -> token
  std::unordered_map<int32_t, std::string> normalized_;  // id -> normalised content, when it differs
  std::unordered_set<std::string> special_;
  int64_t max_id_ = -1;
  Matcher raw_, norm_;
};

}  // namespace moe::text
