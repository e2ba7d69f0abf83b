// The tool-call formats models write, each as a block of text between markers, and how
// one block's text becomes calls. tool_calls.h finds the blocks in a streamed reply;
// this file only reads one block it is given.
//
//   hermes        Qwen2.5/Qwen3, Hermes:  <tool_call>{"name": N, "arguments": {...}}</tool_call>
//   qwen3_coder   Qwen3-Coder:            <tool_call><function=N><parameter=P>value</parameter>...
//                                         </function></tool_call>  (values typed by the tool's schema)
//   deepseek_v3   DeepSeek-V3, R1:        <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N
//                                         ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseek_v31  DeepSeek-V3.1:          <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//   mistral       Mistral, Mixtral:       [TOOL_CALLS] [{"name": N, "arguments": {...}}, ...]
//                                         (and the later [TOOL_CALLS]N[ARGS]{...} / [TOOL_CALLS]N{...})
//
// The token strings are those of the models' tokenizers and chat templates (the same
// strings vLLM's and SGLang's parsers look for). The two DeepSeek parsers read both
// call shapes: a V3-style body under deepseek_v31 (or the reverse) is still a call.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/parsers/text_scan.h"

namespace moe::serve::parsers {

enum class ToolCallKind { none, hermes, qwen3_coder, deepseek_v3, deepseek_v31, mistral };

// A call as the model wrote it: arguments is a JSON object.
struct ParsedCall {
  std::string name;
  nlohmann::ordered_json arguments;
};

// How a block that starts with a marker ends.
enum class BlockEnd {
  marker,  // at end_marker
  json,    // where the JSON after the marker (Mistral) closes
  drop,    // the marker alone is the block: framing that is removed (DeepSeek's calls_begin/end)
};
struct Opener {
  std::string_view marker;
  BlockEnd end;
  std::string_view end_marker;  // BlockEnd::marker only
};
// The markers that open a block in a format, in the order they are tried at one place.
const std::vector<Opener>& openers(ToolCallKind kind);

// Mistral's block has no end marker: where it ends in `body` (the text after
// "[TOOL_CALLS]"), as a JsonExtent (incomplete while it may still go on).
JsonExtent mistral_extent(std::string_view body);

// One block's calls, or nullopt when it is not a well-formed call (its text then stays
// content). body: the text between the opener and the end (the end marker excluded);
// terminated: the end was seen (false: the reply ended inside the block, which is
// accepted only where the body proves the call complete). tools: the request's tool
// list (Qwen3-Coder types values by it), or null.
std::optional<std::vector<ParsedCall>> parse_block(ToolCallKind kind, const Opener& opener, std::string_view body,
                                                   bool terminated, const nlohmann::ordered_json& tools);

// Qwen3-Coder writes every parameter value as text: the value as the JSON type the
// tool's schema gives for it (a value that does not read as that type stays a string).
nlohmann::ordered_json typed_value(const std::string& text, const nlohmann::ordered_json* schema);

}  // namespace moe::serve::parsers
