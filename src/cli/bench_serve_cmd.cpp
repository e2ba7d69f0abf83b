// moe-ep bench-serve: load an OpenAI-compatible server (moe-ep serve, vLLM, ...) at a
// few concurrency levels and print TTFT / inter-token latency / throughput.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <csignal>
#include <fstream>
#include <memory>

#include "core/atomic_file.h"
#include "cli/verbs.h"
#include "core/check.h"
#include "serve/bench_client.h"

namespace moe {

namespace {

struct AgentOptions {
  int turns = 0;  // 0: the concurrency sweep
  int64_t turn_tokens = 1024;
};

int run_agent(const serve::BenchServeOptions& o, const AgentOptions& a, const std::string& output_json) {
  fmt::print("bench-serve: agent replay on {} /v1/completions: {} turns, +{} prompt tokens a turn, {} output tokens\n",
             o.url, a.turns, a.turn_tokens, o.output_len);
  const serve::AgentResult r =
      serve::run_agent_replay(o, a.turns, a.turn_tokens, [](const std::string& line) { fmt::print("  {}\n", line); });
  fmt::print("\nmodel {}\n{}", r.model, serve::agent_table(r));
  if (!output_json.empty())
    write_file_atomic(output_json, serve::agent_json(o, a.turn_tokens, r).dump(2) + "\n", "--output-json");
  int failed = 0;
  for (const auto& t : r.turns) failed += !t.error.empty();
  if (failed) fmt::print(stderr, "bench-serve: {} turns failed their checks: their figures do not count\n", failed);
  return failed ? 1 : 0;
}

int run_bench_serve_cmd(serve::BenchServeOptions& o, const std::string& output_json,
                        const std::vector<int64_t>& token_range, const AgentOptions& agent) {
  std::signal(SIGPIPE, SIG_IGN);  // a server that resets a connection is an error to report, not a crash
  if (!token_range.empty()) {
    MOE_CHECK(token_range.size() == 2, "--token-range takes LO,HI, got {} values", token_range.size());
    o.token_lo = token_range[0], o.token_hi = token_range[1];
  }
  if (agent.turns > 0) return run_agent(o, agent, output_json);
  fmt::print("bench-serve: {} {}, prompt ~{} tokens, {} output tokens, {} requests per level\n", o.url,
             o.chat ? "/v1/chat/completions" : "/v1/completions", o.prompt_len, o.output_len, o.requests);
  serve::BenchResult result = serve::run_bench_serve(o, [](const std::string& line) { fmt::print("  {}\n", line); });
  fmt::print("\nmodel {}\n{}", result.model, serve::bench_table(result));
  int errors = 0;
  for (const auto& L : result.levels) {
    errors += L.errors;
    for (const auto& e : L.error_samples) fmt::print("concurrency {}: error: {}\n", L.concurrency, e);
  }
  if (!output_json.empty()) {
    write_file_atomic(output_json, serve::bench_json(o, result).dump(2) + "\n", "--output-json");
  }
  if (errors) fmt::print(stderr, "bench-serve: {} requests failed: the figures cover the completed ones only\n", errors);
  return errors ? 1 : 0;
}

}  // namespace

Verb add_bench_serve_verb(CLI::App& app) {
  auto o = std::make_shared<serve::BenchServeOptions>();
  auto output_json = std::make_shared<std::string>();
  auto token_range = std::make_shared<std::vector<int64_t>>();
  auto agent = std::make_shared<AgentOptions>();
  CLI::App* c = app.add_subcommand(
      "bench-serve",
      "Benchmark an OpenAI-compatible server: streaming requests at each concurrency level; prints time to first "
      "token, inter-token latency, output tokens/s and requests/s. Exit 1 if any request failed or returned "
      "other than --output-len tokens");
  c->add_option("--url", o->url, "Server base URL")->capture_default_str();
  c->add_option("--concurrency", o->concurrency, "Concurrency levels, comma separated: requests in flight at once")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--prompt-len", o->prompt_len,
                "Prompt tokens: exactly this many random token ids for /v1/completions, about this many words for "
                "--chat")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--output-len", o->output_len, "Output tokens per request (max_tokens, with ignore_eos)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--requests", o->requests, "Requests per concurrency level")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--model", o->model, "Model name to request (default: the first one GET /v1/models lists)");
  c->add_option("--api-key", o->api_key, "Sent as 'Authorization: Bearer KEY'");
  c->add_flag("--chat", o->chat, "Use /v1/chat/completions with a word prompt (default: /v1/completions)");
  c->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  c->add_option("--timeout", o->timeout_s, "Seconds a request may take before it counts as failed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--token-range", *token_range,
                "LO,HI: the random prompt ids of /v1/completions are drawn from [LO, HI) (default 1000,10000)")
      ->delimiter(',');
  c->add_option("--agent-turns", agent->turns,
                "Instead of the concurrency sweep, replay one agent conversation of this many turns, its history "
                "growing by --turn-tokens random token ids a turn (/v1/completions): per turn the time to first "
                "token of the whole history from the prefix cache (its cache_salt), of the whole history cold (a "
                "fresh salt) and of the new tokens alone; checks the cached answer equals the cold one")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--turn-tokens", agent->turn_tokens, "Prompt tokens each agent turn adds (--agent-turns)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto response_format = std::make_shared<std::string>();
  c->add_option("--response-format", *response_format,
                "JSON sent as every request's response_format, e.g. '{\"type\": \"json_object\"}' (structured "
                "outputs; the reply must still run --output-len tokens, so give a format that cannot end early)");
  c->add_option("--output-json", *output_json, "Also write the results as JSON to this file");
  return {c, [o, output_json, token_range, agent, response_format] {
            if (!response_format->empty()) {
              o->response_format = nlohmann::json::parse(*response_format, nullptr, false);
              MOE_CHECK(o->response_format.is_object(), "--response-format must be a JSON object, got '{}'",
                        *response_format);
            }
            return run_bench_serve_cmd(*o, *output_json, *token_range, *agent);
          }};
}

}  // namespace moe
