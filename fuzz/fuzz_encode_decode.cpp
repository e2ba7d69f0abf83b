// libFuzzer: arbitrary text through the qwen3 (byte-level BPE) and mixtral (SentencePiece-
// style BPE with byte fallback) fixture tokenizers, and the ernie SentencePiece model.
// The first byte picks the tokenizer and the options, the rest is the text.
//  - invalid UTF-8 must be rejected with moe::Error, valid UTF-8 must encode;
//  - every id is in [0, vocab_size());
//  - qwen3: decode(encode(x)) == x when x is already NFC (its normalizer) -- byte-level
//    BPE loses nothing else;
//  - IncrementalDecoder: the pieces concatenate to decode(ids) and are valid UTF-8, also
//    for arbitrary id sequences (selector bit 5: the rest of the input is 16-bit ids).
// Fixtures: $MOE_TOK_FIXTURES or MOE_FIXTURES_DIR/text/tokenizers.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/check.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

#ifndef MOE_FIXTURES_DIR
#define MOE_FIXTURES_DIR "tests/fixtures"
#endif

namespace {

struct Toks {
  std::unique_ptr<moe::text::Tokenizer> qwen, mixtral, ernie;
};

const Toks& toks() {
  static const Toks t = [] {
    const char* env = std::getenv("MOE_TOK_FIXTURES");
    const std::string base = env ? env : std::string(MOE_FIXTURES_DIR) + "/text/tokenizers";
    Toks r;
    r.qwen = moe::text::Tokenizer::from_dir(base + "/qwen3");
    r.mixtral = moe::text::Tokenizer::from_dir(base + "/mixtral");
    r.ernie = moe::text::Tokenizer::from_dir(base + "/ernie");
    return r;
  }();
  return t;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Toks& t = toks();
  const moe::text::Tokenizer& tok = (sel % 3 == 0) ? *t.qwen : (sel % 3 == 1) ? *t.mixtral : *t.ernie;
  const moe::text::EncodeOptions opt{.add_special_tokens = (sel & 4) != 0, .parse_special = (sel & 8) != 0};
  const moe::text::DecodeOptions dopt{.skip_special_tokens = (sel & 16) != 0};

  const bool valid = moe::text::uni::find_invalid_utf8(text) == std::string::npos;
  std::vector<int32_t> ids;
  if (sel & 32) {
    // The rest is arbitrary ids (as a model may generate them), two bytes each.
    // At most 300 (IncrementalDecoder decodes the whole prefix per id: quadratic).
    for (size_t i = 0; i + 1 < text.size() && ids.size() < 300; i += 2)
      ids.push_back(static_cast<int32_t>((static_cast<uint8_t>(text[i]) | static_cast<uint8_t>(text[i + 1]) << 8) %
                                         tok.vocab_size()));
  } else {
    try {
      ids = tok.encode(text, opt);
    } catch (const moe::Error&) {
      check(!valid);  // only invalid UTF-8 may be refused
      return 0;
    }
    check(valid);
  }
  for (int32_t id : ids) check(id >= 0 && id < tok.vocab_size());
  const std::string out = tok.decode(ids, dopt);
  check(moe::text::uni::find_invalid_utf8(out) == std::string::npos);
  if (&tok == t.qwen.get() && !(sel & 32) && !opt.add_special_tokens && !dopt.skip_special_tokens &&
      moe::text::uni::normalize(text, moe::text::uni::NormForm::NFC) == text)
    check(out == text);

  moe::text::IncrementalDecoder inc(tok, dopt);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = inc.push(id);
    check(moe::text::uni::find_invalid_utf8(piece) == std::string::npos);
    all += piece;
  }
  all += inc.finish();
  check(all == out);
  return 0;
}
