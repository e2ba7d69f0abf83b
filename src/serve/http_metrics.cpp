#include "serve/http_metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace moe::serve {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v, uint64_t times) {
  if (times == 0) return;
  const size_t b = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());  // le: v <= bound
  std::lock_guard lk(mu_);
  counts_[b] += times;
  sum_ += v * double(times);
  count_ += times;
}

uint64_t Histogram::count() const {
  std::lock_guard lk(mu_);
  return count_;
}

void Histogram::write(std::string* out, const std::string& name, const std::string& help) const {
  std::lock_guard lk(mu_);
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

// Buckets as vLLM's: decode steps of a few ms up to minutes-long queues.
HttpMetrics::HttpMetrics()
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                           10.0, 20.0, 40.0, 80.0, 160.0, 640.0}),
      inter_token_latency({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                           1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      request_duration({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void HttpMetrics::request(const std::string& route, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{route, status}];
}

void HttpMetrics::tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_ += prompt;
  generation_tokens_ += generated;
}

std::string HttpMetrics::text() const {
  std::string out;
  out += "# HELP moe_ep_requests_total HTTP requests answered, by route and status code.\n"
         "# TYPE moe_ep_requests_total counter\n";
  {
    std::lock_guard lk(mu_);
    for (const auto& [key, n] : requests_)
      out += fmt::format("moe_ep_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  }
  out += fmt::format(
      "# HELP moe_ep_prompt_tokens_total Prompt tokens of the generation requests answered.\n"
      "# TYPE moe_ep_prompt_tokens_total counter\nmoe_ep_prompt_tokens_total {}\n"
      "# HELP moe_ep_generation_tokens_total Tokens generated for the requests answered.\n"
      "# TYPE moe_ep_generation_tokens_total counter\nmoe_ep_generation_tokens_total {}\n"
      "# HELP moe_ep_http_requests_in_flight Generation requests being answered now.\n"
      "# TYPE moe_ep_http_requests_in_flight gauge\nmoe_ep_http_requests_in_flight {}\n",
      prompt_tokens_.load(), generation_tokens_.load(), in_flight.load());
  time_to_first_token.write(&out, "moe_ep_time_to_first_token_seconds",
                            "Seconds from a request's arrival to its first generated token.");
  inter_token_latency.write(&out, "moe_ep_inter_token_latency_seconds",
                            "Seconds between generated tokens as they reach the client.");
  request_duration.write(&out, "moe_ep_request_duration_seconds",
                         "Seconds from a generation request's arrival to the end of its answer.");
  return out;
}

}  // namespace moe::serve
