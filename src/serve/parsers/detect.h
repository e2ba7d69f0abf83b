// Which reasoning and tool-call parsers a served model gets: by flag
// (--reasoning-parser, --tool-call-parser), or `auto` from its chat template and
// tokenizer.
//
// auto, reasoning: the template mentions <think> and the vocabulary has <think> and
// </think> as tokens (both are needed: a template that only strips old <think> blocks
// from the history, next to a vocabulary without them, is not a thinking model).
// DeepSeek templates (<｜Assistant｜>) get deepseek_r1, others qwen3.
// auto, tool calls: the template's own call markup says the format: DeepSeek's
// <｜tool▁calls▁begin｜> (with ```json: V3/R1, without: V3.1), Qwen3-Coder's <function=
// and <parameter=, Hermes/Qwen's <tool_call>, Mistral's [TOOL_CALLS].
#pragma once

#include <string>
#include <string_view>

#include "serve/parsers/reasoning.h"
#include "serve/parsers/tool_formats.h"

namespace moe::text {
class Tokenizer;
class ChatTemplate;
}  // namespace moe::text

namespace moe::serve::parsers {

const char* name_of(ReasoningKind k);  // "none", "deepseek_r1", "qwen3"
const char* name_of(ToolCallKind k);   // "none", "hermes", "qwen3_coder", ...

struct ParserChoice {
  ReasoningKind reasoning = ReasoningKind::none;
  ToolCallKind tools = ToolCallKind::none;
  // The think tags are special tokens in this vocabulary: decoding must keep special
  // tokens while the reasoning is parsed, or the tags vanish from the text.
  bool think_tags_special = false;
  // The same for the tool-call markers (Mistral's [TOOL_CALLS] is a control token).
  bool tool_markers_special = false;
  std::string summary;  // "reasoning parser qwen3 (auto), tool-call parser hermes (auto)"
};

// reasoning_flag: auto|deepseek_r1|qwen3|none; tool_flag: auto|hermes|qwen3_coder|
// deepseek_v3|deepseek_v31|mistral|none. Throws moe::Error naming an unknown value.
// tmpl may be null (no chat template: auto gives none).
ParserChoice choose_parsers(std::string_view reasoning_flag, std::string_view tool_flag,
                            const text::ChatTemplate* tmpl, const text::Tokenizer& tok);

// The detection rules on their own (for tests): template text and whether the vocabulary
// has both think tags.
ReasoningKind detect_reasoning(std::string_view template_source, bool vocab_has_think_tags);
ToolCallKind detect_tool_calls(std::string_view template_source);

}  // namespace moe::serve::parsers
