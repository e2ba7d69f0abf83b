// Finding tool calls in a streamed reply (the content after any reasoning): text outside
// the format's blocks is content, each block that reads as calls (tool_formats.h)
// becomes tool calls, and a block that does not is given back as content, markers and
// all: text the parser cannot read never fails the request.
//
// A call goes out whole, when its block closes. Sending the arguments token by token
// (as vLLM does) would mean sending text that may turn out not to be a call, which
// could then not be taken back; this way the streamed deltas always add up to exactly
// the non-streamed reply, and a broken call is content in both. The cost: a call's
// arguments arrive when the model has finished writing them.
//
// Whitespace that only separates content from a call (the "\n\n" before <tool_call>,
// the newline between two calls) is dropped; other whitespace is kept, so a reply
// without calls comes back byte for byte. Streaming holds back a trailing whitespace
// run and a possible start of a marker ("<tool_" ...) until the next piece decides.
// Not thread-safe: one per response.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/parsers/tool_formats.h"

namespace moe::serve::parsers {

struct ToolCall {
  std::string id;         // "call_<24 alphanumerics>" (Mistral: 9 alphanumerics, as its templates demand)
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's function.arguments is a string)
};

// What a reply turns into, in order. Adjacent text of one kind is one event.
struct Event {
  enum class Kind { reasoning, content, tool_call };
  Kind kind = Kind::content;
  std::string text;  // reasoning / content
  ToolCall call;     // tool_call
};
using Events = std::vector<Event>;
void add_text(Events& out, Event::Kind kind, std::string_view text);

struct ToolCallOptions {
  ToolCallKind kind = ToolCallKind::none;
  nlohmann::ordered_json tools;       // the request's tool list (Qwen3-Coder types values by it), or null
  std::string only_name;              // tool_choice named a function: a call to another is not a call
  std::function<std::string()> new_id;  // ids for the calls
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallOptions opt);
  void push(std::string_view text, Events& out);
  void finish(Events& out);

 private:
  void content(std::string_view s, Events& out);
  void boundary();  // a call (or framing) was here: whitespace next to it goes
  void close_block(std::string_view body, bool terminated, Events& out);

  ToolCallOptions opt_;
  const std::vector<Opener>& openers_;
  std::string buf_;                // outside: text not yet decided; inside a block: its body so far
  const Opener* open_ = nullptr;   // the block we are in, if any
  size_t scanned_ = 0;             // inside: body bytes already searched for the end marker
  std::string held_ws_;            // a whitespace run that may turn out to border a call
  bool after_call_ = false;        // whitespace now follows a call: dropped
};

}  // namespace moe::serve::parsers
