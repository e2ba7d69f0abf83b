#include "serve/parsers/detect.h"

#include <fmt/format.h>

#include "core/check.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace moe::serve::parsers {

const char* name_of(ReasoningKind k) {
  switch (k) {
    case ReasoningKind::deepseek_r1: return "deepseek_r1";
    case ReasoningKind::qwen3: return "qwen3";
    case ReasoningKind::none: break;
  }
  return "none";
}

const char* name_of(ToolCallKind k) {
  switch (k) {
    case ToolCallKind::hermes: return "hermes";
    case ToolCallKind::qwen3_coder: return "qwen3_coder";
    case ToolCallKind::deepseek_v3: return "deepseek_v3";
    case ToolCallKind::deepseek_v31: return "deepseek_v31";
    case ToolCallKind::mistral: return "mistral";
    case ToolCallKind::none: break;
  }
  return "none";
}

ReasoningKind detect_reasoning(std::string_view src, bool vocab_has_think_tags) {
  if (!vocab_has_think_tags || src.find("<think>") == std::string_view::npos) return ReasoningKind::none;
  return src.find("<｜Assistant｜>") != std::string_view::npos ? ReasoningKind::deepseek_r1 : ReasoningKind::qwen3;
}

ToolCallKind detect_tool_calls(std::string_view src) {
  auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  // The most specific markup first: Qwen3-Coder's templates also write <tool_call>.
  if (has("<｜tool▁calls▁begin｜>")) return has("```json") ? ToolCallKind::deepseek_v3 : ToolCallKind::deepseek_v31;
  if (has("<function=") && has("<parameter=")) return ToolCallKind::qwen3_coder;
  if (has("<tool_call>")) return ToolCallKind::hermes;
  if (has("[TOOL_CALLS]")) return ToolCallKind::mistral;
  return ToolCallKind::none;
}

namespace {

bool special_token(const text::Tokenizer& tok, std::string_view s) {
  auto id = tok.token_to_id(s);
  return id && tok.is_special(*id);
}

}  // namespace

ParserChoice choose_parsers(std::string_view reasoning_flag, std::string_view tool_flag,
                            const text::ChatTemplate* tmpl, const text::Tokenizer& tok) {
  ParserChoice c;
  const std::string_view src = tmpl ? std::string_view(tmpl->source()) : std::string_view();
  if (reasoning_flag == "auto") {
    c.reasoning = detect_reasoning(src, tok.token_to_id("<think>") && tok.token_to_id("</think>"));
  } else {
    bool found = false;
    for (ReasoningKind k : {ReasoningKind::none, ReasoningKind::deepseek_r1, ReasoningKind::qwen3})
      if (reasoning_flag == name_of(k)) c.reasoning = k, found = true;
    MOE_CHECK(found, "--reasoning-parser must be auto, deepseek_r1, qwen3 or none, got '{}'", reasoning_flag);
  }
  if (tool_flag == "auto") {
    c.tools = detect_tool_calls(src);
  } else {
    bool found = false;
    for (ToolCallKind k : {ToolCallKind::none, ToolCallKind::hermes, ToolCallKind::qwen3_coder,
                           ToolCallKind::deepseek_v3, ToolCallKind::deepseek_v31, ToolCallKind::mistral})
      if (tool_flag == name_of(k)) c.tools = k, found = true;
    MOE_CHECK(found, "--tool-call-parser must be auto, hermes, qwen3_coder, deepseek_v3, deepseek_v31, mistral or "
              "none, got '{}'", tool_flag);
  }
  c.think_tags_special = c.reasoning != ReasoningKind::none &&
                         (special_token(tok, "<think>") || special_token(tok, "</think>"));
  for (const Opener& op : openers(c.tools)) {
    c.tool_markers_special |= special_token(tok, op.marker);
    if (op.end == BlockEnd::marker) c.tool_markers_special |= special_token(tok, op.end_marker);
  }
  c.summary = fmt::format("reasoning parser {}{}, tool-call parser {}{}", name_of(c.reasoning),
                          reasoning_flag == "auto" ? " (auto)" : "", name_of(c.tools),
                          tool_flag == "auto" ? " (auto)" : "");
  return c;
}

}  // namespace moe::serve::parsers
