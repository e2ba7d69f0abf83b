// Splitting a chat reply into the model's thinking (`reasoning_content`) and its answer
// (`content`), for models that think inside <think>...</think>: DeepSeek-R1, V3.1 (with
// thinking on) and Qwen3.
//
// Where the reply starts matters as much as its tags, and the rendered prompt says it:
//  * the prompt ends inside an open <think> (DeepSeek-R1's and V3.1's templates, Qwen3
//    thinking-2507 and Qwen3.5): the reply starts in the reasoning and only </think> shows;
//  * the prompt ends with a closed think block (Qwen3 with enable_thinking: false writes
//    "<think>\n\n</think>\n\n", V3.1 without thinking writes "</think>"): no reasoning,
//    the whole reply is content;
//  * otherwise the reply may open <think> itself (Qwen3's first template): it is
//    reasoning if it starts with <think>. deepseek_r1 differs here only: like vLLM's R1
//    parser it takes a reply without <think> as reasoning until </think> (R1 models often
//    leave out the opening tag).
// Reasoning that never closes (the reply hit max_tokens) is all reasoning.
//
// Whitespace: the newlines a template puts around the tags are dropped (leading and
// trailing whitespace of the reasoning, leading whitespace of the content after
// </think>), as the Qwen3 and DeepSeek templates strip them when the history is sent
// back. A reply without any think block is returned byte for byte.
//
// Streaming: push() pieces of the reply, finish() at its end. What they return
// concatenates to the same text whatever the pieces were; a piece that ends in a
// possible start of a tag ("</th") or in whitespace is held until the next one decides.
// Not thread-safe: one per response.
#pragma once

#include <string>
#include <string_view>

namespace moe::serve::parsers {

enum class ReasoningKind { none, deepseek_r1, qwen3 };

// How the rendered prompt leaves the think block (see above).
enum class PromptThink { none, open, closed };
PromptThink prompt_think(std::string_view rendered_prompt);

class ReasoningSplitter {
 public:
  struct Out {
    std::string reasoning, content;  // in a piece, all reasoning comes before all content
  };
  ReasoningSplitter(ReasoningKind kind, PromptThink prompt);
  Out push(std::string_view text);
  Out finish();

 private:
  enum class State { start, reasoning, after_think, content };
  void run(Out& out);
  void emit_reasoning(std::string_view piece, Out& out);
  State state_;
  bool start_in_reasoning_ = false;  // state start: text that is not "<think>" is reasoning
  bool lead_ = true;                 // state reasoning: nothing emitted yet, leading whitespace goes
  std::string buf_;                  // text not yet decided
  std::string held_ws_;              // reasoning: a whitespace run that may end the reasoning
};

}  // namespace moe::serve::parsers
