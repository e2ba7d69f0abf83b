// Requests in flight and the preparation of one forward step (nano-vllm's
// prepare_prefill / prepare_decode, kept apart from Model::forward).
//
// A Sequence owns one KV-cache slot for its lifetime. prepare_step() takes the
// sequences that run in the step and lays out their uncached tokens: a sequence
// that has nothing cached contributes its whole prompt (prefill), one with the
// prompt cached contributes its newest token (decode); both kinds may share a step.
// With a token budget a long prompt is cut into chunks over several steps (chunked
// prefill: the activations of a step are bounded by the budget, not the prompt); the
// result is the same bits, since attention and the MoE GEMMs do not depend on how the
// positions are batched (model/attention_kernels.h, kernels/grouped_gemm.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/model_config.h"

namespace moe {

struct Sequence {
  int64_t id = 0;               // request index in the user's batch (output order, RNG key)
  int32_t slot = 0;             // KV-cache slot
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t n_prompt = 0;
  int64_t n_cached = 0;         // positions already written to the cache
  int64_t n_step = 0;           // tokens the prepared step takes (prepare_step), cached by commit_step
  bool done = false;
  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
};

// all_logits: logits for every new token (the `forward` verb); else for the last
// token of each sequence whose step reaches it (generation). max_tokens > 0: the step
// takes at most that many tokens, the sequences' in order (a sequence the budget does not
// reach takes none; every step takes at least one token).
StepBatch prepare_step(const std::vector<Sequence*>& seqs, bool all_logits, int64_t max_tokens = 0);
// True when the prepared step takes the sequence's last token (its logits row exists).
inline bool step_reaches_end(const Sequence& s) {
  return s.n_step > 0 && s.n_cached + s.n_step == static_cast<int64_t>(s.tokens.size());
}
// Marks the step's tokens as cached.
void commit_step(const std::vector<Sequence*>& seqs);

// "1,2,3;4,5" -> {{1,2,3},{4,5}}; errors name the prompt and the bad text.
std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& text);
// Checks a batch against the model and the cache: non-empty prompts, ids in
// [0, vocab), prompt + max_new_tokens within max_seq. Errors name the prompt.
void validate_prompts(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& prompts, int64_t max_seq,
                      int64_t max_new_tokens);

}  // namespace moe
