// Requests in flight and the preparation of one forward step (nano-vllm's
// prepare_prefill / prepare_decode, kept apart from Model::forward).
//
// A Sequence owns one KV-cache slot for its lifetime. prepare_step() takes the
// sequences that run in the step and lays out their uncached tokens: a sequence
// that has nothing cached contributes its whole prompt (prefill), one with the
// prompt cached contributes its newest token (decode); both kinds may share a step.
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
  bool done = false;
  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
};

// all_logits: logits for every new token (the `forward` verb); else for the last
// token of each sequence (generation).
StepBatch prepare_step(const std::vector<Sequence*>& seqs, bool all_logits);
// Marks the step's tokens as cached.
void commit_step(const std::vector<Sequence*>& seqs);

// "1,2,3;4,5" -> {{1,2,3},{4,5}}; errors name the prompt and the bad text.
std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& text);
// Checks a batch against the model and the cache: non-empty prompts, ids in
// [0, vocab), prompt + max_new_tokens within max_seq. Errors name the prompt.
void validate_prompts(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& prompts, int64_t max_seq,
                      int64_t max_new_tokens);

}  // namespace moe
