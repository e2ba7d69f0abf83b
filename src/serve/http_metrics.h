// The HTTP layer's own Prometheus series (text exposition format 0.0.4): requests by
// route and status, prompt/generated tokens, and latency histograms measured where the
// client sees them (time to first token, between tokens, whole request).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace moe::serve {

// A cumulative Prometheus histogram. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v, uint64_t times = 1);
  // Appends # HELP, # TYPE, the _bucket series (le="...", then +Inf), _sum and _count.
  void write(std::string* out, const std::string& name, const std::string& help) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative (summed when written)
  double sum_ = 0;
  uint64_t count_ = 0;
};

class HttpMetrics {
 public:
  HttpMetrics();
  // One answered request. route: a known route or "other" (unknown paths must not
  // create new series).
  void request(const std::string& route, int status);
  void tokens(int64_t prompt, int64_t generated);
  std::string text() const;

  Histogram time_to_first_token;  // seconds from the request's arrival to its first token
  Histogram inter_token_latency;  // seconds between tokens as they reach the client
  Histogram request_duration;     // seconds from arrival to the last byte of the answer
  std::atomic<int64_t> in_flight{0};  // generation requests being answered

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0}, generation_tokens_{0};
};

}  // namespace moe::serve
