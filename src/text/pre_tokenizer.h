// tokenizer.json "pre_tokenizer": Sequence, Split, ByteLevel, Metaspace, Digits,
// Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit,
// FixedLength, as `tokenizers` defines them (src/pre_tokenizers/*.rs). Other types
// (UnicodeScripts) are rejected with an error naming them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/json_util.h"
#include "text/normalized.h"

namespace moe::text {

// One piece of PreTokenizedString: text still to tokenize, or an added token already
// matched (id >= 0), which pre-tokenizers and the model leave alone.
struct Split {
  NormalizedString text;
  int32_t id = -1;
};
using Splits = std::vector<Split>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(Splits& splits) const = 0;
  // Whether the result depends on where a piece was in the original text (Metaspace with
  // prepend_scheme "first"), so alignments must be tracked.
  virtual bool needs_offsets() const { return false; }
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const js::json& j, const std::string& where);

// The (range, is_match) pieces of a per-character predicate, as `tokenizers`' Pattern
// impl for Fn(char) -> bool.
template <class F>
void char_matches(std::string_view text, F pred, std::vector<Pattern::Piece>& out) {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t last = 0, i = 0;
  while (i < text.size()) {
    const size_t b = i;
    const char32_t c = uni::next_cp(text, i);
    if (pred(c)) {
      if (last < b) out.push_back({last, b, false});
      out.push_back({b, i, true});
      last = i;
    }
  }
  if (text.size() > last) out.push_back({last, text.size(), false});
}

// The SplitDelimiterBehavior named s ("Removed", "Isolated", ...).
SplitBehavior parse_behavior(const std::string& s, const std::string& where);

}  // namespace moe::text
