// Structured outputs: what the sampler asks of a grammar engine, and no more.
//
// A request that constrains its reply (response_format json_object / json_schema,
// tool_choice "required" or a named function) carries a Grammar; the engine starts one
// Matcher per request and, before every draw, masks each token the grammar forbids, so
// the reply always parses. The grammar covers the whole reply: the model's reasoning
// block (free text up to </think>, serve/grammar/structural.h) and then the constrained
// part. The engine behind the interface is xgrammar (serve/grammar/xgrammar_compiler.h);
// the HTTP layer and the request fuzzer see only this header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe::serve::grammar {

// Token masks are bitsets over the model's vocabulary: bit (id % 32) of word id / 32 set
// means token id may come next. mask_words(V) words of uint32_t hold V tokens.
inline int64_t mask_words(int64_t vocab) { return (vocab + 31) / 32; }
inline bool mask_allows(const uint32_t* mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

// One request's place in its grammar. Not thread-safe: one owner (the scheduler), which
// may hand it to a helper thread for fill_mask while the forward step runs.
class Matcher {
 public:
  virtual ~Matcher() = default;
  // The tokens that may come next (mask_words(vocab) words). When the grammar is
  // complete only the stop tokens are allowed.
  virtual void fill_mask(uint32_t* mask) = 0;
  // Advances past `id`; false (and no change) when the grammar forbids it.
  virtual bool accept(int32_t id) = 0;
  // A stop token was accepted: the reply is complete.
  virtual bool terminated() const = 0;
};

// A compiled grammar, shared (read-only) by every request that asks for the same one.
class Grammar {
 public:
  virtual ~Grammar() = default;
  virtual std::unique_ptr<Matcher> start() const = 0;
};

// Compiles xgrammar structural-tag format objects (structural.h builds them). Thread-safe:
// HTTP threads compile while the scheduler runs. Throws ServeError 400 naming what in the
// format cannot be compiled (an unsupported or self-contradictory schema).
class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual std::shared_ptr<const Grammar> compile(const nlohmann::ordered_json& format) const = 0;
};

}  // namespace moe::serve::grammar
