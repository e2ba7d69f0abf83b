#include "serve/engine.h"

namespace moe::serve {

const char* finish_reason(Finish f) {
  switch (f) {
    case Finish::stop: return "stop";
    case Finish::length: return "length";
    case Finish::cancelled: return "cancelled";
    case Finish::error: return "error";
    case Finish::none: break;
  }
  return "";
}

Finish Stream::read(Delta* out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return finish_ != Finish::none || !pending_.text.empty() || !pending_.tokens.empty(); });
  out->text += pending_.text;
  out->tokens.insert(out->tokens.end(), pending_.tokens.begin(), pending_.tokens.end());
  pending_.text.clear();
  pending_.tokens.clear();
  return finish_;
}

void Stream::cancel() {
  std::lock_guard lk(mu_);
  cancelled_ = true;
}

bool Stream::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

void Stream::append(const std::string& text, const TokenLogprob& tok) {
  {
    std::lock_guard lk(mu_);
    if (ttft_s_ < 0) ttft_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
    pending_.text += text;
    pending_.tokens.push_back(tok);
    ++completion_tokens_;
  }
  wake();
}

void Stream::append_text(const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard lk(mu_);
    pending_.text += text;
  }
  wake();
}

void Stream::finish(Finish f, const std::string& error) {
  {
    std::lock_guard lk(mu_);
    if (finish_ != Finish::none) return;
    finish_ = f;
    error_ = error;
  }
  wake();
}

void Stream::wake() {
  cv_.notify_all();
  std::shared_ptr<Notifier> n;
  {
    std::lock_guard lk(mu_);
    n = notifier_;
  }
  if (n) n->notify();
}

int64_t Stream::prompt_tokens() const {
  std::lock_guard lk(mu_);
  return prompt_tokens_;
}

int64_t Stream::completion_tokens() const {
  std::lock_guard lk(mu_);
  return completion_tokens_;
}

double Stream::time_to_first_token_s() const {
  std::lock_guard lk(mu_);
  return ttft_s_;
}

}  // namespace moe::serve
