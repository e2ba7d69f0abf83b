#include "serve/choices.h"

namespace moe::serve {

ChoiceGroup::ChoiceGroup(Engine& engine, RequestParams params, int n)
    : engine_(engine), params_(std::move(params)), n_(n), finish_(size_t(n), Finish::none) {
  std::shared_ptr<Stream> s = engine_.submit(n_ > 1 ? params_ : std::move(params_));
  if (!s) throw ServeError(503, "server_error", "the engine returned no stream");
  s->set_notifier(notifier_);
  streams_.push_back(std::move(s));
}

ChoiceGroup::~ChoiceGroup() {
  for (size_t i = 0; i < streams_.size(); ++i)
    if (finish_[i] == Finish::none) streams_[i]->cancel();
}

void ChoiceGroup::submit_rest() {
  for (int i = 1; i < n_; ++i) {
    RequestParams p = params_;
    p.sampling.seed = params_.sampling.seed + uint64_t(i);  // u64: wraps past 2^64 - 1
    std::shared_ptr<Stream> s;
    try {
      s = engine_.submit(std::move(p));
    } catch (...) {
      cancel();
      throw;
    }
    if (!s) {
      cancel();
      throw ServeError(503, "server_error", "the engine returned no stream");
    }
    s->set_notifier(notifier_);
    streams_.push_back(std::move(s));
  }
}

bool ChoiceGroup::read(std::vector<Delta>* deltas, std::chrono::milliseconds timeout) {
  deltas->resize(size_t(n_));
  // Drain what is there; wait only when nothing was (the count is taken before the
  // drain, so output arriving in between ends the wait at once).
  auto drain = [&] {
    bool any = false;
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (finish_[i] != Finish::none) continue;
      Delta& d = (*deltas)[i];
      const size_t text = d.text.size(), toks = d.tokens.size();
      finish_[i] = streams_[i]->read(&d, std::chrono::milliseconds(0));
      any = any || finish_[i] != Finish::none || d.text.size() != text || d.tokens.size() != toks;
    }
    return any;
  };
  const uint64_t seen = notifier_->count();
  if (!drain()) {
    notifier_->wait_past(seen, timeout);
    drain();
  }
  if (int(streams_.size()) < n_ && !cancelled_) {
    if (finish_[0] == Finish::error || finish_[0] == Finish::cancelled) {
      cancel();  // the others would fail the same way; the response is an error
    } else if (finish_[0] != Finish::none || streams_[0]->completion_tokens() > 0) {
      submit_rest();
    }
  }
  for (size_t i = 0; i < size_t(n_); ++i)
    if (i >= streams_.size() ? !cancelled_ : finish_[i] == Finish::none) return false;
  return true;
}

int ChoiceGroup::failed() const {
  for (size_t i = 0; i < streams_.size(); ++i)
    if (finish_[i] == Finish::error || finish_[i] == Finish::cancelled) return int(i);
  return -1;
}

void ChoiceGroup::cancel() {
  cancelled_ = true;
  for (auto& s : streams_) s->cancel();
}

int64_t ChoiceGroup::completion_tokens() const {
  int64_t n = 0;
  for (const auto& s : streams_) n += s->completion_tokens();
  return n;
}

int64_t ChoiceGroup::cached_tokens() const { return streams_[0]->cached_tokens(); }

}  // namespace moe::serve
