// A chat reply's text in, OpenAI's message parts out: reasoning_content, content and
// tool_calls. The reasoning is split off first (reasoning.h); tool calls are looked for
// in the content after it (tool_calls.h), never inside the thinking.
//
// One parser serves both kinds of response: a whole reply is push(all) + finish(), a
// stream is push() per piece + finish(). So a streamed reply's deltas always concatenate
// to the non-streamed one (the tests check it for random chunkings).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/parsers/reasoning.h"
#include "serve/parsers/tool_calls.h"

namespace moe::serve::parsers {

// What a request asks of the parsers (checked and filled by parse_request).
struct ParseOptions {
  ReasoningKind reasoning = ReasoningKind::none;
  PromptThink prompt = PromptThink::none;  // how the rendered prompt left <think>
  ToolCallKind tools = ToolCallKind::none;  // none: tool-call text stays content
  nlohmann::ordered_json tool_list;         // the request's tools
  std::string only_name;                    // tool_choice named this function
  bool active() const { return reasoning != ReasoningKind::none || tools != ToolCallKind::none; }
};

using IdSource = std::function<std::string()>;
// Random call ids: "call_" + 24 alphanumerics (OpenAI's shape), or for Mistral 9
// alphanumerics (its chat templates reject any other id in the history).
IdSource random_ids(ToolCallKind kind);

class OutputParser {
 public:
  explicit OutputParser(const ParseOptions& opt, IdSource ids = {});
  Events push(std::string_view text);
  Events finish();
  int tool_calls() const { return calls_; }

 private:
  void route(ReasoningSplitter::Out&& o, Events& out);
  ReasoningSplitter reasoning_;
  std::optional<ToolCallParser> tools_;
  int calls_ = 0;
};

// A whole reply, taken apart.
struct ParsedOutput {
  std::optional<std::string> reasoning;  // nullopt: no reasoning (or no reasoning parser)
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedOutput parse_output(const ParseOptions& opt, std::string_view text, IdSource ids = {});

}  // namespace moe::serve::parsers
