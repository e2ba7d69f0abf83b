// The grammar of a constrained reply, as xgrammar structural-tag format objects
// (https://xgrammar.mlc.ai, "Structural Tag"): plain JSON, built here without the engine,
// so the request parser (and its fuzzer) can build it and only the compile needs
// xgrammar.
//
//   response_format json_object      any JSON object
//   response_format json_schema      JSON that validates against the schema
//   tool_choice "required"           one or more calls, each of a listed tool with
//                                    arguments that validate against its parameters,
//                                    in the server's tool-call format, and nothing else
//   tool_choice {"function": N}      exactly one call of N
//
// The reply's reasoning comes first and is free text: the grammar starts after it, as
// vLLM's does (reply_format). The call shapes are those the parsers read back
// (parsers/tool_formats.h), so a constrained call always comes back as tool_calls.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "serve/parsers/reasoning.h"
#include "serve/parsers/tool_formats.h"

namespace moe::serve::grammar {

using Json = nlohmann::ordered_json;

// The most tools a request may list (OpenAI's limit): a grammar over more would take
// long to compile for a single request.
inline constexpr size_t kMaxTools = 128;
// The largest schema (as JSON text) a request may constrain to: real schemas are a few
// KiB; compile time grows with the schema.
inline constexpr size_t kMaxSchemaBytes = 64 * 1024;

// The longest run of whitespace the JSON grammar allows between tokens. Unbounded, a
// model that favours whitespace tokens can spend its whole max_tokens between two
// values (seen on the fixture models); 20 still lets a model pretty-print JSON nested
// four deep with an indent of four ("\n" + 16 spaces). xgrammar's max_whitespace_cnt.
inline constexpr int kMaxWhitespace = 20;

Json json_object_format();
Json json_schema_format(const Json& schema);

// tools: the request's checked tool list ({"type": "function", "function": {"name",
// "parameters"?}}); only_name: the named function, or empty for "required". Throws
// ServeError 400 for a format without a constrained shape (none).
Json tool_call_format(parsers::ToolCallKind kind, const Json& tools, const std::string& only_name);

// The whole reply: the reasoning block the prompt leaves open (or, for qwen3, one the
// reply may open itself), then `body`. Without a reasoning parser, or after a prompt
// that closed the think block, the body alone.
Json reply_format(const Json& body, parsers::ReasoningKind reasoning, parsers::PromptThink prompt);

// {"type": "structural_tag", "format": format}: what the compiler takes.
Json structural_tag(const Json& format);

}  // namespace moe::serve::grammar
