// A load generator for an OpenAI-compatible server (`moe-ep bench-serve`): at each
// concurrency level, R streaming requests with prompts of about P tokens and exactly N
// output tokens (ignore_eos, max_tokens N); it measures time to first token, the time
// between tokens, output tokens/s and requests/s.
//
// It checks before it measures: a request counts only if its stream ended with
// [DONE], finish_reason "length" and usage.completion_tokens == N; every other outcome
// is an error, reported with its reason. It is a benchmark: no timing is ever a failure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe::serve {

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme://host:port[/prefix]
  std::vector<int> concurrency = {1, 4, 16, 64};
  int64_t prompt_len = 128;
  int64_t output_len = 128;
  int requests = 64;          // per concurrency level
  std::string model;          // empty: the first model GET /v1/models lists
  std::string api_key;
  bool chat = false;          // /v1/chat/completions with a word prompt; else /v1/completions with token ids
  uint64_t seed = 0;          // prompts depend only on (seed, request index)
  double timeout_s = 600;     // per request
  // /v1/completions prompts are random token ids in [token_lo, token_hi) (exactly
  // prompt_len of them); the default range is ordinary text tokens in any large vocabulary.
  int64_t token_lo = 1000, token_hi = 10000;
  // Sent as every request's response_format (structured outputs), or null. The reply
  // must still run all output_len tokens: give a format a model cannot finish early,
  // e.g. a JSON array of strings (tools/bench_structured.sh).
  nlohmann::json response_format;
};

struct BenchRequest {
  bool ok = false;
  std::string error;          // why not ok
  double ttft_s = 0;          // send -> first content
  double latency_s = 0;       // send -> [DONE]
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
  std::string text;           // the streamed text, whole
  std::vector<double> itl_s;  // per-token gaps between content chunks
  double tpot_s = 0;          // (last content - first content) / (tokens - 1)
};

struct BenchLevel {
  int concurrency = 0;
  int requests = 0, completed = 0, errors = 0;
  std::vector<std::string> error_samples;  // the first few distinct reasons
  double wall_s = 0;
  double requests_per_s = 0, output_tokens_per_s = 0;
  double ttft_p50_s = 0, ttft_p99_s = 0, ttft_mean_s = 0;
  double itl_p50_s = 0, itl_p99_s = 0;
  double tpot_mean_s = 0;     // per request: (last content - first content) / (tokens - 1)
  double latency_p50_s = 0, latency_p99_s = 0;
  double prompt_tokens_mean = 0;
  int64_t output_tokens = 0;
};

struct BenchResult {
  std::string model;  // as requested (BenchServeOptions::model, or the server's first)
  std::vector<BenchLevel> levels;
};

// Throws moe::Error when the server cannot be reached or names no model. `log` gets a
// line per level as it ends.
BenchResult run_bench_serve(const BenchServeOptions& o, const std::function<void(const std::string&)>& log = {});
// Agent replay (--agent-turns): one conversation that an agent resends whole every
// turn, its history growing by turn_tokens random token ids a turn. Each turn runs
// three streamed /v1/completions requests, one at a time, with the same output_len:
//   cold:  the whole history under a cache_salt no other request has (prefilled whole);
//   new:   only this turn's new tokens under a fresh salt: the cost of prefilling only
//          what is new, the floor a prefix cache can reach;
//   agent: the whole history under the conversation's own salt (served from the prefix
//          cache from turn 2 on), last, so its blocks are the most recently used.
// Checked before measured: every request as run_bench_serve checks it, the agent's
// greedy text equal to the cold one's, no cached tokens reported for cold and new,
// some for the agent from turn 2 on (a server without a prefix cache fails this).
struct AgentTurn {
  int turn = 0;
  int64_t context = 0;  // prompt tokens of the whole history
  double ttft_agent_s = 0, ttft_cold_s = 0, ttft_new_s = 0;
  int64_t cached_tokens = 0;  // the agent request's
  std::string error;          // non-empty: the turn failed its checks
};
struct AgentResult {
  std::string model;
  std::vector<AgentTurn> turns;
};
AgentResult run_agent_replay(const BenchServeOptions& o, int turns, int64_t turn_tokens,
                             const std::function<void(const std::string&)>& log = {});
std::string agent_table(const AgentResult& r);
nlohmann::ordered_json agent_json(const BenchServeOptions& o, int64_t turn_tokens, const AgentResult& r);

// Linear interpolation between order statistics (numpy's default); 0 for no samples.
double percentile(std::vector<double> v, double p);

std::string bench_table(const BenchResult& r);
nlohmann::ordered_json bench_json(const BenchServeOptions& o, const BenchResult& r);

}  // namespace moe::serve
