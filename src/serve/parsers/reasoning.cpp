#include "serve/parsers/reasoning.h"

#include "serve/parsers/text_scan.h"

namespace moe::serve::parsers {

namespace {
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
}  // namespace

PromptThink prompt_think(std::string_view rendered) {
  const std::string_view tail = trim_ws(rendered);
  if (tail.ends_with(kThinkClose)) return PromptThink::closed;
  if (tail.ends_with(kThinkOpen)) return PromptThink::open;
  return PromptThink::none;
}

ReasoningSplitter::ReasoningSplitter(ReasoningKind kind, PromptThink prompt) {
  if (kind == ReasoningKind::none || prompt == PromptThink::closed) {
    state_ = State::content;
    return;
  }
  state_ = State::start;
  // R1 reasons from the first token whatever the template wrote; Qwen3 only when the
  // prompt opened the block.
  start_in_reasoning_ = prompt == PromptThink::open || kind == ReasoningKind::deepseek_r1;
}

ReasoningSplitter::Out ReasoningSplitter::push(std::string_view text) {
  Out out;
  if (state_ == State::content) {  // the common case after the reasoning: no copies
    out.content.assign(text);
    return out;
  }
  buf_.append(text);
  run(out);
  return out;
}

// Reasoning text goes out except a trailing whitespace run, which waits: if </think>
// follows, it is dropped.
void ReasoningSplitter::emit_reasoning(std::string_view piece, Out& out) {
  size_t body = piece.size();
  while (body > 0 && is_ws(piece[body - 1])) --body;
  if (body == 0) {
    held_ws_.append(piece);
    return;
  }
  out.reasoning += held_ws_;
  out.reasoning.append(piece.substr(0, body));
  held_ws_.assign(piece.substr(body));
}

void ReasoningSplitter::run(Out& out) {
  for (;;) {
    switch (state_) {
      case State::start: {
        // Leading whitespace, then "<think>" or text.
        const size_t i = skip_ws(buf_);
        if (i == buf_.size()) return;  // only whitespace so far
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.starts_with(kThinkOpen)) {
          buf_.erase(0, i + kThinkOpen.size());
          state_ = State::reasoning;
          break;
        }
        if (kThinkOpen.starts_with(rest)) return;  // "<thi": wait
        if (start_in_reasoning_) {
          buf_.erase(0, i);
          state_ = State::reasoning;
        } else {
          state_ = State::content;  // no think block: the reply as it is, whitespace and all
        }
        break;
      }
      case State::reasoning: {
        if (lead_) {
          buf_.erase(0, skip_ws(buf_));
          if (buf_.empty()) return;
          lead_ = false;
        }
        const size_t close = buf_.find(kThinkClose);
        if (close != std::string::npos) {
          // The reasoning's trailing whitespace (held, or in this piece) is dropped.
          emit_reasoning(std::string_view(buf_).substr(0, close), out);
          held_ws_.clear();
          buf_.erase(0, close + kThinkClose.size());
          state_ = State::after_think;
          break;
        }
        const size_t keep = partial_marker_len(buf_, kThinkClose);
        emit_reasoning(std::string_view(buf_).substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::after_think:
        buf_.erase(0, skip_ws(buf_));
        if (buf_.empty()) return;
        state_ = State::content;
        break;
      case State::content:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningSplitter::Out ReasoningSplitter::finish() {
  Out out;
  switch (state_) {
    case State::start:
      // Whitespace and at most a cut "<think": text of whichever part the reply starts in.
      if (start_in_reasoning_) out.reasoning.append(trim_ws(buf_));
      else out.content = buf_;
      break;
    case State::reasoning:
      // Cut off inside the reasoning: a held "</th" is text; trailing whitespace goes.
      if (!buf_.empty()) out.reasoning += held_ws_ + buf_;
      break;
    case State::after_think:
    case State::content:
      out.content += buf_;  // empty: both states hand on everything at once
      break;
  }
  buf_.clear();
  held_ws_.clear();
  return out;
}

}  // namespace moe::serve::parsers
