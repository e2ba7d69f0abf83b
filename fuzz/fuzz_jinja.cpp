// libFuzzer: arbitrary bytes as a Jinja chat template plus its context. The input is
// "<template>\0<JSON context>" (no NUL: all of it is the template and the context is a
// small chat). Parsing and rendering, under tight limits, must either succeed or throw
// moe::Error: any other exception, a crash, a hang (-timeout) or runaway memory
// (-rss_limit_mb) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace {

const nlohmann::ordered_json& default_context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hi \u00e9\u4e16 <|im_end|>"},
                 {"role": "assistant", "content": null, "reasoning_content": "hmm",
                  "tool_calls": [{"id": "call_1", "type": "function",
                                  "function": {"name": "f", "arguments": {"b": 1, "a": [1.5, true, null]}}}]},
                 {"role": "tool", "content": "{\"ok\": 1}"},
                 {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string source(in.substr(0, nul));
  nlohmann::ordered_json ctx = default_context();
  if (nul != std::string_view::npos) {
    // Invalid JSON, or JSON that is not an object, falls back to the default chat.
    auto parsed = nlohmann::ordered_json::parse(in.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) ctx = std::move(parsed);
  }
  moe::jinja::Options opt;
  opt.max_steps = 200'000;   // keeps each run well under libFuzzer's timeout
  opt.max_depth = 100;
  opt.max_output = 1 << 20;  // and its memory far below -rss_limit_mb
  bool rendered = false;
  try {
    moe::jinja::Template t(source, "fuzz", opt);
    (void)t.render(ctx);
    rendered = true;
  } catch (const moe::Error&) {
  }
  // A template that rendered within the tight budget also goes through the chat layer
  // (message clean-up, special tokens), which uses the default limits.
  if (rendered) {
    try {
      moe::text::ChatTemplate ct(source, "fuzz_chat");
      moe::text::ChatRequest req;
      req.messages = default_context()["messages"];
      req.tools = default_context()["tools"];
      moe::text::SpecialTokens st;
      st.bos = "<s>";
      st.eos = "</s>";
      (void)ct.render(req, st);
    } catch (const moe::Error&) {
    }
  }
  return 0;
}
