// tokenizer.json "normalizer": Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend,
// Strip, StripAccents, Nmt, ByteLevel, BertNormalizer, as `tokenizers` defines them. Any
// other type (e.g. Precompiled) is rejected with an error naming it.
#pragma once

#include <memory>
#include <string>

#include "text/json_util.h"
#include "text/normalized.h"

namespace moe::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(NormalizedString& s) const = 0;
};

// nullptr for a JSON null. `where` names the file and field for errors.
std::unique_ptr<Normalizer> make_normalizer(const js::json& j, const std::string& where);

// The {"String": ...} / {"Regex": ...} object in j["pattern"] (Replace, Split).
Pattern parse_split_pattern(const js::json& j, const std::string& where);

}  // namespace moe::text
