// The served model: rank 0's continuous-batching scheduler (an Engine for the HTTP
// layer) and the loop the other ranks run.
//
// Scheduling, between two steps (nano-vllm / vLLM style, simplified):
//   1. new requests join the waiting queue (FIFO); cancelled ones leave and free their
//      KV blocks;
//   2. admission: while fewer than max_num_seqs run, the head of the queue gets a cache
//      slot and KV blocks for prompt + max_tokens positions (reserved up front, so a
//      running request never needs a block that is not there: no preemption, no
//      out-of-memory; when the pool is short the queue waits);
//   3. the step: one token for every running request past its prompt (decode), then
//      prompt chunks of the requests still in prefill, in arrival order, until
//      max_batch_tokens (chunked prefill: a long prompt takes several steps while the
//      others keep decoding);
//   4. rank 0 broadcasts the step plan, every rank runs Model::forward on it, rank 0
//      samples each finished row and streams the text.
// Same answers alone or in a batch: every kernel is batch-invariant (a row's result
// does not depend on the other rows), attention reads a sequence's own blocks in
// position order whatever block ids it got, and a sampled draw depends only on (seed,
// step). When there is nothing to run, rank 0 broadcasts an idle plan every
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
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace moe::serve {

struct EngineOptions {
  int64_t max_num_seqs = 64;        // requests in the running batch
  int64_t max_batch_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  int64_t max_queue = 1024;         // waiting requests before submit() answers 503
  double heartbeat_s = 0.2;         // idle-plan period (well under --comm-timeout)
  std::vector<int64_t> eos_ids;     // config + generation_config + the tokenizer's eos
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
  void admit();
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
  int64_t n_waiting_shared_ = 0, n_running_shared_ = 0, kv_used_shared_ = 0;
  std::vector<std::vector<int64_t>> load_shared_;  // expert load snapshot [layer][E]
  std::optional<EplbReport> eplb_shared_;          // --eplb-interval: the rebalances so far
  double comm_s_ = 0, comm_bytes_ = 0;
  int64_t steps_ = 0, prefill_tokens_ = 0, decode_tokens_ = 0;

  // Scheduler thread only.
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> free_slots_;
  int64_t next_id_ = 0;
};

// Ranks > 0: receive step plans from rank 0 and run them until a stop plan.
void run_follower(Model& model);

}  // namespace moe::serve
