// Whole-batch inference on a Model: one prefill forward, and generation (prefill,
// then decode steps until every request hits EOS or max_new_tokens).
//
// Under DP attention (--dp D) request i runs on replica i % D. Every rank runs the
// same number of steps (lock-step): each step starts with a world-wide count of
// unfinished requests, and a rank with none left still runs the step with 0 tokens,
// so every MoE layer's collectives see every rank. Tokens are sampled on the first
// rank of a replica and broadcast to the others, so the ranks of a replica never
// disagree. Results are gathered to every rank in request order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/stage_profile.h"
#include "core/tensor.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace moe {

// The CLI's default prefill chunk (generate, chat), as serve's --max-batch-tokens and
// llama.cpp's -b. Measured on the 4-layer Qwen3-30B-A3B-shaped checkpoint with a
// 4096-token prompt (docs/PERF.md, seventh session): in a process's first forward (every
// `generate` run) chunks of 2048 prefilled 1.5-1.6x faster than the whole prompt (bf16
// 921-925 against 570-610 tokens/s, Q4_0 874 against 566: the whole prompt's 1 GB more of
// fresh activation pages cost the kernel 6-20 s of system time); warm, they cost bf16 4-8 %
// (each chunk streams every expert's weights once) and Q4_0 nothing. Peak RSS 1.0 GB lower.
inline constexpr int64_t kDefaultPrefillChunk = 2048;

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;  // run to max_new_tokens even after EOS
  bool keep_logits = false;  // record each step's logits of this rank's requests (tests)
  // > 0: a step takes at most this many tokens, so a long prompt is prefilled in chunks
  // over several steps (activation memory bounded by the chunk, not the prompt; the same
  // tokens and logits). 0: every prompt whole in the first step.
  int64_t prefill_chunk = 0;
  // More ids that end a request, beside the config's eos_token_id (e.g. the tokenizer's
  // end-of-turn token).
  std::vector<int64_t> extra_eos;
  // > 0: draws only ids below this, the tokenizer's size. Checkpoints pad their
  // vocabulary past it (Qwen3: 151,936 rows, 151,669 tokens); a padding id has no text.
  int64_t sample_vocab = 0;
  // Called on the first rank of the request's DP replica with each sampled token (not
  // for EOS); returning true ends the request there (a stop string). The decision
  // travels with the token to the replica's other ranks, so they never disagree.
  std::function<bool(int64_t request, int32_t token)> on_token;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // [B] generated ids per request
  // keep_logits: [B][step * V + v] for the requests of this rank's replica (else empty rows)
  std::vector<std::vector<float>> step_logits;
  double prefill_s = 0, decode_s = 0;
  // Seconds and entries per stage of the prefill and the decode steps, when
  // prof::enabled() (else 0).
  prof::Totals prefill_stages{}, decode_stages{};
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_steps = 0;  // summed over replicas
  // Tokens routed to each expert [layer][E], summed over replicas (when counted).
  std::vector<std::vector<int64_t>> expert_load;
  int64_t steps = 0;  // forward steps the run took (every rank the same)
  std::optional<EplbReport> eplb;  // --eplb-interval: what rebalancing did
};

GenerateResult generate(Model& m, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opt);

// The prefill logits of every prompt: [B, S_max, V] f32, rows past a prompt's length
// zero. One forward step (per replica under DP); every rank gets the whole tensor.
Tensor prefill_logits(Model& m, const std::vector<std::vector<int32_t>>& prompts);

}  // namespace moe
