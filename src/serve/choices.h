// The n choices of one request (OpenAI's `n`): n engine requests with the same prompt,
// read together. Choice i samples with seed + i, so a seeded request repeats, and greedy
// choices are all equal (as vLLM's child requests).
//
// Choice 0 is submitted first and the others once it has produced its first token: by
// then its prompt's full KV blocks are in the prefix cache (serve/engine/block_pool.h),
// so the other choices share them and prefill only the prompt's last, partial block.
// Submitted together, all n would prefill the whole prompt side by side. The wait costs
// the other choices one step of choice 0's prefill, which they would spend anyway.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "serve/engine.h"

namespace moe::serve {

class ChoiceGroup {
 public:
  // Submits choice 0 (ServeError from the engine passes through).
  ChoiceGroup(Engine& engine, RequestParams params, int n);
  ~ChoiceGroup();  // cancels what still runs
  ChoiceGroup(const ChoiceGroup&) = delete;
  ChoiceGroup& operator=(const ChoiceGroup&) = delete;

  int size() const { return n_; }
  // Waits up to `timeout` for output of any choice and appends what arrived to
  // (*deltas)[i] (sized n). Submits the other choices once choice 0 has a token; a
  // ServeError from that submit passes through (what runs is cancelled first). Returns
  // true when every choice has finished.
  bool read(std::vector<Delta>* deltas, std::chrono::milliseconds timeout);
  // Choice i's finish state (Finish::none while it runs or before it is submitted).
  Finish finish(int i) const { return finish_[size_t(i)]; }
  // The first choice that ended in error or was cancelled by the engine, or -1.
  int failed() const;
  const Stream& stream(int i) const { return *streams_[size_t(i)]; }
  void cancel();  // every choice, submitted or not: none will be submitted any more
  int64_t completion_tokens() const;  // over every choice
  // The prompt tokens the prefix cache served choice 0 (the prompt counts once in usage).
  int64_t cached_tokens() const;

 private:
  void submit_rest();
  Engine& engine_;
  RequestParams params_;  // choice 0's; the others copy it with their own seed
  int n_;
  std::shared_ptr<Notifier> notifier_ = std::make_shared<Notifier>();
  std::vector<std::shared_ptr<Stream>> streams_;  // [n] once all are submitted, [1] before
  std::vector<Finish> finish_;                    // [n]
  bool cancelled_ = false;
};

}  // namespace moe::serve
