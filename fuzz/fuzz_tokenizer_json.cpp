// libFuzzer: arbitrary bytes as tokenizer.json. Loading must either succeed or throw
// moe::Error (any other exception, a crash or a sanitizer report is a bug). A tokenizer
// that loads must then encode and decode a few texts without anything but moe::Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/check.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<moe::text::Tokenizer> tok;
  try {
    tok = moe::text::Tokenizer::from_json(text, {}, "fuzz.json");
  } catch (const moe::Error&) {
    return 0;
  }
  for (std::string_view s : {std::string_view("Hello, world! 123 \xC3\xA9\xE4\xB8\x96 <s> [CLS]"), std::string_view(""),
                             std::string_view("  \n\t x"), text.substr(0, 64)}) {
    for (bool special : {true, false}) {
      std::vector<int32_t> ids;
      try {
        ids = tok->encode(s, {.add_special_tokens = special, .parse_special = special});
      } catch (const moe::Error&) {
        continue;  // e.g. an unk token the vocabulary lacks
      }
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();  // encode made an id decode rejects
      // Decoding what encode produced must not fail (an exception here aborts the run).
      const std::string out = tok->decode(ids);
      (void)tok->decode(ids, {.skip_special_tokens = true});
      moe::text::IncrementalDecoder inc(*tok);
      std::string all;
      for (int32_t id : ids) all += inc.push(id);
      all += inc.finish();
      if (all != out) __builtin_trap();
    }
  }
  (void)tok->special_tokens();
  (void)tok->token_to_id("a");
  (void)tok->id_to_token(0);
  return 0;
}
