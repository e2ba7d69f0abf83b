// What the HTTP layer sees of the model: an Engine on rank 0 that takes a request
// (already tokenized, parameters checked) and returns a Stream of its output.
//
// Threads: HTTP handler threads call Engine::submit and read their Stream; the
// scheduler thread (runs the model steps) writes every Stream. The HTTP side never
// touches the model, so a slow or hostile client can only hurt itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/sampler.h"
#include "serve/grammar/grammar.h"

namespace moe::text {
class Tokenizer;
class ChatTemplate;
}  // namespace moe::text

namespace moe::serve {

// A request the engine refuses: the HTTP status and OpenAI error type to answer with.
struct ServeError {
  // A constructor, not an aggregate: ServeError{status, type, message[, param[, code]]}
  // then needs no trailing fields (and -Wextra does not warn about them).
  ServeError(int status_ = 400, std::string type_ = "invalid_request_error", std::string message_ = "",
             std::string param_ = "", std::string code_ = "")
      : status(status_), type(std::move(type_)), message(std::move(message_)), param(std::move(param_)),
        code(std::move(code_)) {}
  int status;         // 400, 404, 413, 503, ...
  std::string type;   // OpenAI "error.type"
  std::string message;
  std::string param;  // the offending field, or empty
  std::string code;   // OpenAI "error.code" (e.g. "model_not_found", "context_length_exceeded"), or empty
};

struct RequestParams {
  std::vector<int32_t> prompt_ids;  // non-empty, ids < vocab
  int64_t max_tokens = 16;          // >= 1; prompt + max_tokens <= max_model_len
  SamplingParams sampling;          // temperature, top_k, top_p, seed
  double presence_penalty = 0;      // OpenAI semantics, in [-2, 2]
  double frequency_penalty = 0;
  int top_logprobs = -1;            // -1: no logprobs; 0..20: logprob of the token + this many alternatives
  std::vector<std::string> stop;    // the text ends before the first occurrence of any
  bool ignore_eos = false;
  bool skip_special_tokens = true;  // in the returned text
  // The request's cache_salt: prefix-cache blocks are shared only between requests with
  // the same salt (vLLM's field), so a tenant can keep its prompts from others' timing.
  std::string cache_salt;
  // The grammar the reply must follow (response_format, a forced tool_choice), or null:
  // every draw is masked to the tokens it allows (serve/grammar/grammar.h).
  std::shared_ptr<const grammar::Grammar> grammar;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;  // log-softmax of the (temperature-free) logits
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely (id, logprob)
};

enum class Finish { none, stop, length, cancelled, error };
const char* finish_reason(Finish f);  // "stop", "length", ... (OpenAI's names)

// What became final since the last read: text never ends in half a UTF-8 character or
// in text that could still turn out to start a stop string.
struct Delta {
  std::string text;
  std::vector<TokenLogprob> tokens;  // generated tokens in this piece (logprob filled when asked)
};

// Wakes a reader that waits on several Streams at once (the n choices of a request,
// serve/choices.h): every append or finish on a Stream it is attached to counts once.
class Notifier {
 public:
  void notify() {
    {
      std::lock_guard lk(mu_);
      ++count_;
    }
    cv_.notify_all();
  }
  uint64_t count() const {
    std::lock_guard lk(mu_);
    return count_;
  }
  // Waits up to `timeout` for the count to pass `seen`.
  void wait_past(uint64_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return count_ != seen; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;
};

// One request's output. The scheduler appends and finishes; one reader drains it.
class Stream {
 public:
  // Waits up to `timeout` for output. Appends what arrived to *out. Returns the finish
  // state (Finish::none while running).
  Finish read(Delta* out, std::chrono::milliseconds timeout);
  // Output that arrives from now on also counts on *n (a reader of several streams
  // waits there); output already pending is the reader's to drain (read with timeout 0).
  void set_notifier(std::shared_ptr<Notifier> n) {
    std::lock_guard lk(mu_);
    notifier_ = std::move(n);
  }
  // The client went away: the scheduler frees the request's KV blocks at its next step.
  void cancel();
  bool cancelled() const;

  // Writer side (scheduler).
  void append(const std::string& text, const TokenLogprob& tok);
  void append_text(const std::string& text);
  void finish(Finish f, const std::string& error = "");
  void set_prompt_tokens(int64_t n) {
    std::lock_guard lk(mu_);
    prompt_tokens_ = n;
  }
  void set_cached_tokens(int64_t n) {
    std::lock_guard lk(mu_);
    cached_tokens_ = n;
  }

  int64_t prompt_tokens() const;
  // Prompt tokens read from the prefix cache instead of prefilled (usage.
  // prompt_tokens_details.cached_tokens), as counted when the request was first admitted.
  int64_t cached_tokens() const {
    std::lock_guard lk(mu_);
    return cached_tokens_;
  }
  int64_t completion_tokens() const;
  const std::string& error() const { return error_; }  // after Finish::error
  double time_to_first_token_s() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Delta pending_;
  Finish finish_ = Finish::none;
  bool cancelled_ = false;
  std::string error_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  double ttft_s_ = -1;
  std::shared_ptr<Notifier> notifier_;
  void wake();  // the reader, and the notifier if any (outside mu_)
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Throws ServeError (queue full: 503; prompt too long for the context or the KV pool: 400).
  virtual std::shared_ptr<Stream> submit(RequestParams params) = 0;
  virtual bool ready() const = 0;   // model loaded, scheduler running
  virtual bool failed() const = 0;  // the engine stopped (a rank died, an error): answer 503
  virtual int64_t max_model_len() const = 0;
  virtual const text::Tokenizer& tokenizer() const = 0;
  virtual const text::ChatTemplate* chat_template() const = 0;  // nullptr: the model has none
  // Prometheus text of the engine's gauges and counters (requests running/waiting,
  // tokens, KV-cache use, expert load, EP communication).
  virtual std::string metrics() const = 0;
};

}  // namespace moe::serve
