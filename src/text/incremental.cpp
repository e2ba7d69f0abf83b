// Incremental detokenisation: decode every id so far and release the text that can no
// longer change. Decoding the whole list each time (not a window) keeps the pieces'
// concatenation exactly decode(all ids) whatever the decoder chain does at the start of
// the text (Metaspace prepend handling, Strip of the first space); it costs O(n) per
// token, ~0.1 ms at n = 4096 on one core, small beside a decode step.
//
// Two things are held back: trailing U+FFFD (a character cut between byte tokens), and
// the text of a trailing run of byte-fallback tokens (<0xNN>): ByteFallback decodes such
// a run as a whole and turns every byte of it into U+FFFD when the run is not valid
// UTF-8, so a later byte can still rewrite characters the run already spelled.
#include <string>

#include "text/tokenizer.h"

namespace moe::text {

namespace {

// U+FFFD, which decode() writes for bytes that do not (yet) form a character.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool is_byte_token(const std::string& t) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4]);
}

}  // namespace

std::string IncrementalDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text = tok_.decode(ids_, opt_);
  size_t stable = text.size();
  // Walk back over the trailing byte tokens, and over ids decode() drops (special tokens
  // when skipping them), which do not end a byte run.
  size_t run = ids_.size();
  bool bytes = false;
  while (run > 0) {
    const int32_t last = ids_[run - 1];
    const std::string t = tok_.id_to_token(last);
    if (is_byte_token(t))
      bytes = true;
    else if (!(t.empty() || (opt_.skip_special_tokens && tok_.is_special(last))))
      break;
    --run;
  }
  if (bytes) {
    // Only the text before the byte run is final (when it is a prefix of the whole).
    const std::string head = tok_.decode(std::vector<int32_t>(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(run)), opt_);
    size_t common = 0;
    while (common < head.size() && common < text.size() && head[common] == text[common]) ++common;
    stable = common;
    // Do not cut inside a character.
    while (stable > 0 && stable < text.size() && (static_cast<unsigned char>(text[stable]) & 0xC0) == 0x80) --stable;
  }
  // A character cut between byte tokens decodes to U+FFFD until its last byte arrives:
  // hold back any trailing U+FFFD (a real one is released by the next character or
  // finish()).
  while (stable >= kReplacement.size() &&
         std::string_view(text).substr(stable - kReplacement.size(), kReplacement.size()) == kReplacement)
    stable -= kReplacement.size();
  if (stable <= emitted_) return {};
  std::string out = text.substr(emitted_, stable - emitted_);
  emitted_ = stable;
  return out;
}

std::string IncrementalDecoder::finish() {
  const std::string text = tok_.decode(ids_, opt_);
  if (text.size() <= emitted_) return {};
  std::string out = text.substr(emitted_);
  emitted_ = text.size();
  return out;
}

}  // namespace moe::text
