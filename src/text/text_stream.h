// Generated text as a user sees it: token ids in, final text out, ending before the
// first stop string (OpenAI's `stop`: the stop text itself is not returned).
//
// Text that could still turn out to be the start of a stop string is held back until
// it cannot, so a streamed piece is never taken back; pieces never end inside a UTF-8
// character (IncrementalDecoder). Concatenated pieces equal what a non-streamed
// request returns: decode(ids) cut at the first stop string.
#pragma once

#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace moe::text {

class TextStream {
 public:
  TextStream(const Tokenizer& tok, std::vector<std::string> stops, DecodeOptions opt = {});

  struct Piece {
    std::string text;      // newly final text (may be empty)
    bool stopped = false;  // a stop string was reached: the sequence is over
  };
  Piece push(int32_t id);  // once stopped, returns empty pieces
  Piece finish();          // the sequence ended (EOS, length): release what is held back
  bool stopped() const { return stopped_; }
  const std::string& text() const { return released_; }  // every piece so far

 private:
  Piece release(bool final);
  IncrementalDecoder dec_;
  std::vector<std::string> stops_;
  std::string pending_;   // decoded, not yet released
  std::string released_;
  bool stopped_ = false;
};

}  // namespace moe::text
