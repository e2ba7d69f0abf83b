// The served model: rank 0's continuous-batching scheduler (an Engine for the HTTP
// layer) and the loop the other ranks run.
//
// Scheduling, between two steps (vLLM v1 style, simplified):
//   1. new requests join the waiting queue (FIFO); cancelled ones leave and give their
//      KV blocks back;
//   2. the step, in tokens up to max_batch_tokens: one token for every running request
//      past its prompt (decode), then prompt chunks of the running requests still in
//      prefill (chunked prefill: a long prompt takes several steps while the others
//      keep decoding), then, while fewer than max_num_seqs run, the head of the queue:
//      its prompt is matched against the prefix cache block by block (serve/engine/
//      block_pool.h; the last prompt token always runs, for the logits) and only the
//      rest is prefilled;
//   3. KV blocks are taken as a sequence grows, not reserved for prompt + max_tokens:
//      when a decode needs a block and none is free or cached, the most recently
//      admitted running request is preempted (its blocks go back, its computed full
//      blocks stay in the prefix cache) and requeued at the front, to be recomputed
//      later, mostly from that cache. A request is refused only if its prompt alone
//      cannot fit the pool;
//   4. rank 0 broadcasts the step plan, every rank runs Model::forward on it, rank 0
//      samples each finished row and streams the text; the blocks the step filled are
//      published to the prefix cache.
// Same answers alone or in a batch: every kernel is batch-invariant (a row's result
// does not depend on the other rows), attention reads a sequence's own blocks in
// position order whatever block ids it got, and a sampled draw depends only on (seed,
// step). So a request served from cached blocks, or recomputed after a preemption,
// returns the tokens and logprobs of a cold run, bit for bit. When there is nothing to run, rank 0 broadcasts an idle plan every
// heartbeat so the other ranks' bounded waits (--comm-timeout) do not expire.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <vector>

#include "model/model.h"
#include "serve/engine.h"
#include "serve/engine/block_pool.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace moe::serve {

struct EngineOptions {
  int64_t max_num_seqs = 64;        // requests in the running batch
  int64_t max_batch_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  int64_t max_queue = 1024;         // waiting requests before submit() answers 503
  double heartbeat_s = 0.2;         // idle-plan period (well under --comm-timeout)
  std::vector<int64_t> eos_ids;     // config + generation_config + the tokenizer's eos
  bool prefix_cache = true;         // --no-prefix-cache: every prompt is prefilled whole
};

struct Request;

class ModelEngine final : public Engine {
 public:
  // `model` must have a paged KV cache with n_slots >= max_num_seqs; model, tokenizer
  // and template must outlive the engine.
  ModelEngine(Model& model, const text::Tokenizer& tok, const text::ChatTemplate* tmpl, EngineOptions opt);
  ~ModelEngine() override;

  std::shared_ptr<Stream> submit(RequestParams params) override;
  bool ready() const override { return ready_; }
  bool failed() const override { return failed_; }
  int64_t max_model_len() const override { return model_.cache().max_seq(); }
  const text::Tokenizer& tokenizer() const override { return tok_; }
  const text::ChatTemplate* chat_template() const override { return tmpl_; }
  std::string metrics() const override;

  // Rank 0: runs steps on the calling thread (the one that drives MPI) until
  // request_stop(); then finishes what runs (new requests get 503), tells the other
  // ranks to stop and returns. Exceptions propagate after every stream got an error.
  void run();
  // Async-signal-safe: sets a flag the loop reads.
  void request_stop() { stop_requested_ = true; }
  // Marks the engine failed and ends every open stream with `why` (HTTP answers 503).
  void fail_all(const std::string& why);

 private:
  // Step planning (step()): blocks for positions [0, upto) of r, taken from the pool
  // (false, nothing taken, when there are not enough).
  bool grow(Request& r, int64_t upto);
  void release_blocks(Request& r);  // all of r's blocks back to the pool
  // Takes r out of the running batch: blocks back to the pool, requeued at the front.
  void preempt(Request& r);
  // The head of the queue into the running batch, its prompt matched against the prefix
  // cache; the prompt tokens it may prefill this step are `budget`. False: no room.
  bool admit_head(int64_t budget);
  void publish_blocks(Request& r);  // r's full, computed blocks into the prefix cache
  void update_shared();             // the gauges metrics() reads
  bool step();  // false: nothing ran
  void sample_rows(const std::vector<Request*>& rows, const Tensor& logits);
  void retire(Request& r, Finish f);

  Model& model_;
  const text::Tokenizer& tok_;
  const text::ChatTemplate* tmpl_;
  EngineOptions opt_;
  std::atomic<bool> ready_{false}, failed_{false}, stop_requested_{false};

  mutable std::mutex mu_;  // guards incoming_ and the metric counters below
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Request>> incoming_;
  int64_t n_waiting_shared_ = 0, n_running_shared_ = 0, kv_used_shared_ = 0, kv_cached_shared_ = 0;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0, preemptions_ = 0;
  std::vector<std::vector<int64_t>> load_shared_;  // expert load snapshot [layer][E]
  std::optional<EplbReport> eplb_shared_;          // --eplb-interval: the rebalances so far
  double comm_s_ = 0, comm_bytes_ = 0;
  int64_t steps_ = 0, prefill_tokens_ = 0, decode_tokens_ = 0;

  // Ids a draw may pick: min(model vocab, tokenizer vocab). Checkpoints pad their
  // vocabulary past the tokenizer (Qwen3: 151,936 rows for 151,669 tokens); a padding id
  // has no text, and one drawn from a random or badly trained model would end the
  // request's decoding in an error, so draws stay below it.
  int64_t sample_vocab_ = 0;

  // Scheduler thread only.
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;
  BlockPool pool_;
  std::vector<int32_t> free_slots_;
  int64_t next_id_ = 0, next_admission_ = 0;
};

// Ranks > 0: receive step plans from rank 0 and run them until a stop plan.
void run_follower(Model& model);

}  // namespace moe::serve
