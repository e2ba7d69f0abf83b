// What one forward step computes, as prepared by the runtime (runtime/runner.h):
// the new tokens of every sequence in the step, flattened, with their positions and
// the KV-cache slot each sequence owns. Kept apart from the forward itself, as
// nano-vllm keeps prepare_* apart from run.
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

// The new tokens [first, first + n) of the step belong to one sequence whose cache
// slot is `slot`; they sit at positions start_pos .. start_pos + n - 1, and attend to
// cache positions 0 .. their own position.
struct SeqSpan {
  int32_t slot = 0;
  int64_t first = 0;
  int64_t n = 0;
  int64_t start_pos = 0;
};

struct StepBatch {
  std::vector<int32_t> tokens;     // [T] token ids
  std::vector<int32_t> positions;  // [T]
  std::vector<SeqSpan> seqs;       // in token order
  std::vector<int64_t> logit_rows;  // rows of [0, T) whose logits the step returns, in order
  // Per logit row (empty: all 0): k > 0 when the caller reads only the k best logits of
  // that row (sampler.h's order: greedy is 1, top-k sampling k, no penalties or
  // logprobs). Under a vocabulary-parallel lm_head (--attn-tp) each rank then sends its
  // k best (value, id) pairs instead of its whole slice, and the row comes back holding
  // those (the row's k best among them, bit for bit) and -inf elsewhere: sample_token
  // gives the token of the whole row. 0: the whole row. Other layouts return whole rows.
  std::vector<int32_t> logit_top_k;
  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

}  // namespace moe
