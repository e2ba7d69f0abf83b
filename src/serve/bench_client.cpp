#include "serve/bench_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "core/check.h"

namespace moe::serve {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "http://host:port/prefix" -> ("http://host:port", "/prefix").
std::pair<std::string, std::string> split_url(const std::string& url) {
  const size_t scheme = url.find("://");
  MOE_CHECK(scheme != std::string::npos, "--url must look like http://HOST:PORT, got '{}'", url);
  const size_t path = url.find('/', scheme + 3);
  std::string base = url.substr(0, path), prefix = path == std::string::npos ? "" : url.substr(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {base, prefix};
}

std::unique_ptr<httplib::Client> make_client(const std::string& base, const BenchServeOptions& o) {
  auto cli = std::make_unique<httplib::Client>(base);
  MOE_CHECK(cli->is_valid(), "--url '{}' is not a URL this client can use (http:// or https://)", base);
  cli->set_connection_timeout(std::chrono::seconds(10));
  const auto t = std::chrono::milliseconds(int64_t(o.timeout_s * 1000));
  cli->set_read_timeout(t);
  cli->set_write_timeout(t);
  cli->set_keep_alive(true);
  // httplib writes the headers and the body separately: with Nagle the body would wait
  // for the server's delayed ACK (40 ms), which would show up as time to first token.
  cli->set_tcp_nodelay(true);
  if (!o.api_key.empty()) cli->set_bearer_token_auth(o.api_key);
  return cli;
}

// Ordinary words: most tokenizers make about one token of each (with its space).
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "was",   "for",   "on",    "that",  "with",  "as",
    "by",    "at",    "from",  "his",   "it",    "an",    "were",  "are",   "which", "be",    "this",  "has",
    "also",  "had",   "first", "one",   "their", "its",   "new",   "after", "who",   "they",  "two",   "her",
    "she",   "been",  "other", "when",  "time",  "during", "there", "into",  "school", "more", "year",  "city",
    "over",  "only",  "world", "would", "three", "most",  "made",  "between", "about", "game", "many",  "then",
    "known", "state", "film",  "under"};

json request_body(const BenchServeOptions& o, const std::string& model, int index) {
  std::mt19937_64 rng(o.seed * 1000003 + uint64_t(index));
  json body = {{"model", model},
               {"max_tokens", o.output_len},
               {"ignore_eos", true},
               {"temperature", 0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (!o.response_format.is_null()) body["response_format"] = o.response_format;
  if (o.chat) {
    std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
    std::string text;
    for (int64_t i = 0; i < o.prompt_len; ++i) {
      if (i) text += ' ';
      text += kWords[word(rng)];
    }
    body["messages"] = json::array({{{"role", "user"}, {"content", text}}});
  } else {
    std::uniform_int_distribution<int64_t> id(o.token_lo, o.token_hi - 1);
    json ids = json::array();
    for (int64_t i = 0; i < o.prompt_len; ++i) ids.push_back(id(rng));
    body["prompt"] = ids;
  }
  return body;
}

// One streamed request, parsed as it arrives.
BenchRequest run_one(httplib::Client& cli, const std::string& path, const BenchServeOptions& o, const json& body) {
  BenchRequest r;
  std::string buf, raw;  // raw: the body when the status is not 200
  std::vector<double> chunk_t;
  bool done = false, failed = false;
  std::string finish;
  const auto t0 = Clock::now();
  int status = 0;

  auto on_event = [&](const std::string& data) {
    if (data == "[DONE]") {
      done = true;
      return;
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      r.error = "a stream event is not JSON: " + data.substr(0, 80);
      failed = true;
      return;
    }
    if (j.contains("error")) {
      r.error = "error event: " + j["error"].value("message", std::string("?"));
      failed = true;
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      r.prompt_tokens = u.value("prompt_tokens", int64_t(0));
      r.completion_tokens = u.value("completion_tokens", int64_t(0));
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        r.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t(0));
    }
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
    const json& c = j["choices"][0];
    std::string text;
    if (c.contains("text") && c["text"].is_string()) text = c["text"];
    else if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
             c["delta"]["content"].is_string())
      text = c["delta"]["content"];
    if (!text.empty()) chunk_t.push_back(since(t0));
    r.text += text;
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish = c["finish_reason"];
  };

  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      raw.append(data, std::min<size_t>(n, 4096 - std::min<size_t>(raw.size(), 4096)));
      return true;
    }
    buf.append(data, n);
    for (size_t pos; (pos = buf.find("\n\n")) != std::string::npos;) {
      const std::string event = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
      if (failed) return false;
    }
    return true;
  };
  auto res = cli.send(req);
  r.latency_s = since(t0);
  if (!failed && !res) r.error = "HTTP: " + httplib::to_string(res.error());
  else if (!failed && status != 200) {
    json e = json::parse(raw, nullptr, false);
    std::string msg = raw.substr(0, 200);
    if (!e.is_discarded() && e.contains("error") && e["error"].is_object())
      msg = e["error"].value("message", msg);
    r.error = fmt::format("HTTP {}: {}", status, msg);
  } else if (!failed && !done) {
    r.error = "the stream ended without [DONE]";
  } else if (!failed && (finish != "length" || r.completion_tokens != o.output_len)) {
    r.error = fmt::format("{} tokens (finish_reason '{}'), expected {} (finish_reason 'length')", r.completion_tokens,
                          finish, o.output_len);
  } else if (!failed) {
    r.ok = true;
  }
  if (!chunk_t.empty()) r.ttft_s = chunk_t.front();
  // Chunks may carry more than one token: each gap is spread over the request's average
  // tokens per chunk.
  if (chunk_t.size() > 1 && r.completion_tokens > 1) {
    const double per_chunk = double(r.completion_tokens - 1) / double(chunk_t.size() - 1);
    for (size_t k = 1; k < chunk_t.size(); ++k) r.itl_s.push_back((chunk_t[k] - chunk_t[k - 1]) / per_chunk);
  }
  if (chunk_t.size() > 1 && r.completion_tokens > 1)
    r.tpot_s = (chunk_t.back() - chunk_t.front()) / double(r.completion_tokens - 1);
  return r;
}

// --model, or the first model GET /v1/models lists.
std::string resolve_model(const std::string& base, const std::string& prefix, const BenchServeOptions& o) {
  if (!o.model.empty()) return o.model;
  auto cli = make_client(base, o);
  auto res = cli->Get(prefix + "/v1/models");
  MOE_CHECK(res, "cannot reach {}: {}", o.url, httplib::to_string(res.error()));
  MOE_CHECK(res->status == 200, "GET {}/v1/models answered {}: {}", o.url, res->status, res->body.substr(0, 200));
  json j = json::parse(res->body, nullptr, false);
  MOE_CHECK(!j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                j["data"][0].contains("id") && j["data"][0]["id"].is_string(),
            "GET {}/v1/models lists no model; pass --model", o.url);
  return j["data"][0]["id"];
}

}  // namespace

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

BenchResult run_bench_serve(const BenchServeOptions& o, const std::function<void(const std::string&)>& log) {
  MOE_CHECK(o.requests >= 1, "--requests must be at least 1, got {}", o.requests);
  MOE_CHECK(o.prompt_len >= 1 && o.output_len >= 1, "--prompt-len and --output-len must be at least 1");
  MOE_CHECK(o.token_lo >= 0 && o.token_hi > o.token_lo, "the token id range [{}, {}) is empty", o.token_lo, o.token_hi);
  auto [base, prefix] = split_url(o.url);

  const std::string model = resolve_model(base, prefix, o);
  const std::string path = prefix + (o.chat ? "/v1/chat/completions" : "/v1/completions");

  BenchResult result;
  result.model = model;
  std::vector<BenchLevel>& levels = result.levels;
  int index_base = 0;
  for (int c : o.concurrency) {
    MOE_CHECK(c >= 1, "--concurrency values must be at least 1, got {}", c);
    std::vector<BenchRequest> results(size_t(o.requests));
    std::atomic<int> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> workers;
    std::mutex err_mu;
    std::string setup_error;
    for (int w = 0; w < std::min(c, o.requests); ++w)
      workers.emplace_back([&] {
        std::unique_ptr<httplib::Client> cli;
        try {
          cli = make_client(base, o);
        } catch (const std::exception& e) {
          std::lock_guard lk(err_mu);
          setup_error = e.what();
          return;
        }
        for (int i; (i = next++) < o.requests;)
          results[size_t(i)] = run_one(*cli, path, o, request_body(o, model, index_base + i));
      });
    for (auto& t : workers) t.join();
    MOE_CHECK(setup_error.empty(), "{}", setup_error);
    index_base += o.requests;  // fresh prompts at every level: no prefix cache carries over

    BenchLevel L;
    L.concurrency = c;
    L.requests = o.requests;
    L.wall_s = since(t0);
    std::vector<double> ttft, itl, tpot, lat, prompt;
    for (const BenchRequest& r : results) {
      if (!r.ok) {
        ++L.errors;
        if (L.error_samples.size() < 5 &&
            std::find(L.error_samples.begin(), L.error_samples.end(), r.error) == L.error_samples.end())
          L.error_samples.push_back(r.error);
        continue;
      }
      ++L.completed;
      L.output_tokens += r.completion_tokens;
      ttft.push_back(r.ttft_s);
      lat.push_back(r.latency_s);
      prompt.push_back(double(r.prompt_tokens));
      itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
      if (r.tpot_s > 0) tpot.push_back(r.tpot_s);
    }
    auto mean = [](const std::vector<double>& v) {
      return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
    };
    L.requests_per_s = L.completed / L.wall_s;
    L.output_tokens_per_s = double(L.output_tokens) / L.wall_s;
    L.ttft_p50_s = percentile(ttft, 50), L.ttft_p99_s = percentile(ttft, 99), L.ttft_mean_s = mean(ttft);
    L.itl_p50_s = percentile(itl, 50), L.itl_p99_s = percentile(itl, 99);
    L.tpot_mean_s = mean(tpot);
    L.latency_p50_s = percentile(lat, 50), L.latency_p99_s = percentile(lat, 99);
    L.prompt_tokens_mean = mean(prompt);
    if (log)
      log(fmt::format("concurrency {}: {}/{} requests completed in {:.2f} s{}", c, L.completed, L.requests, L.wall_s,
                      L.errors ? fmt::format(" ({} errors, e.g. {})", L.errors, L.error_samples.front()) : ""));
    levels.push_back(std::move(L));
  }
  return result;
}

AgentResult run_agent_replay(const BenchServeOptions& o, int turns, int64_t turn_tokens,
                             const std::function<void(const std::string&)>& log) {
  MOE_CHECK(turns >= 1 && turn_tokens >= 1, "--agent-turns and --turn-tokens must be at least 1");
  MOE_CHECK(o.token_lo >= 0 && o.token_hi > o.token_lo, "the token id range [{}, {}) is empty", o.token_lo, o.token_hi);
  auto [base, prefix] = split_url(o.url);
  AgentResult result;
  result.model = resolve_model(base, prefix, o);
  auto cli = make_client(base, o);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> id(o.token_lo, o.token_hi - 1);
  std::vector<int64_t> history;
  // Salts unique to this run, so an earlier run's cached blocks never count.
  const std::string run = fmt::format("{}-{}", o.seed, Clock::now().time_since_epoch().count());
  auto body = [&](const std::vector<int64_t>& ids, const std::string& salt) {
    return json{{"model", result.model},   {"prompt", ids},      {"max_tokens", o.output_len},
                {"ignore_eos", true},       {"temperature", 0},   {"stream", true},
                {"stream_options", {{"include_usage", true}}}, {"cache_salt", salt}};
  };
  const std::string path = prefix + "/v1/completions";
  for (int t = 1; t <= turns; ++t) {
    const std::vector<int64_t> fresh = [&] {
      std::vector<int64_t> v(static_cast<size_t>(turn_tokens));
      for (auto& x : v) x = id(rng);
      return v;
    }();
    history.insert(history.end(), fresh.begin(), fresh.end());
    const BenchRequest cold = run_one(*cli, path, o, body(history, fmt::format("cold-{}-{}", run, t)));
    const BenchRequest fresh_only = run_one(*cli, path, o, body(fresh, fmt::format("new-{}-{}", run, t)));
    const BenchRequest agent = run_one(*cli, path, o, body(history, "agent-" + run));
    AgentTurn a;
    a.turn = t;
    a.context = int64_t(history.size());
    a.ttft_agent_s = agent.ttft_s, a.ttft_cold_s = cold.ttft_s, a.ttft_new_s = fresh_only.ttft_s;
    a.cached_tokens = agent.cached_tokens;
    for (const BenchRequest* r : {&cold, &fresh_only, &agent})
      if (a.error.empty() && !r->ok) a.error = r->error;
    if (a.error.empty() && agent.text != cold.text)
      a.error = "the agent's answer from the prefix cache differs from the cold one";
    else if (a.error.empty() && (cold.cached_tokens != 0 || fresh_only.cached_tokens != 0))
      a.error = "a request under a fresh cache_salt reported cached tokens";
    else if (a.error.empty() && t > 1 && agent.cached_tokens <= 0)
      a.error = "the agent's history was not served from a prefix cache (cached_tokens 0)";
    if (log)
      log(fmt::format("turn {}: context {} tokens, TTFT agent {:.1f} ms ({} cached), cold {:.1f} ms, new only {:.1f} "
                      "ms{}",
                      t, a.context, a.ttft_agent_s * 1e3, a.cached_tokens, a.ttft_cold_s * 1e3, a.ttft_new_s * 1e3,
                      a.error.empty() ? "" : "; error: " + a.error));
    result.turns.push_back(std::move(a));
  }
  return result;
}

std::string agent_table(const AgentResult& r) {
  std::string out = fmt::format("{:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "turn", "context", "cached",
                                "TTFT agent", "TTFT cold", "TTFT new", "agent/new");
  out += fmt::format("{:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "", "tokens", "tokens", "ms", "ms", "ms", "");
  for (const AgentTurn& a : r.turns)
    out += fmt::format("{:>5} {:>8} {:>8} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.2f}{}\n", a.turn, a.context,
                       a.cached_tokens, a.ttft_agent_s * 1e3, a.ttft_cold_s * 1e3, a.ttft_new_s * 1e3,
                       a.ttft_new_s > 0 ? a.ttft_agent_s / a.ttft_new_s : 0.0, a.error.empty() ? "" : "  FAILED");
  return out;
}

json agent_json(const BenchServeOptions& o, int64_t turn_tokens, const AgentResult& r) {
  json turns = json::array();
  for (const AgentTurn& a : r.turns)
    turns.push_back({{"turn", a.turn},
                     {"context_tokens", a.context},
                     {"cached_tokens", a.cached_tokens},
                     {"ttft_ms", {{"agent", a.ttft_agent_s * 1e3}, {"cold", a.ttft_cold_s * 1e3}, {"new_only", a.ttft_new_s * 1e3}}},
                     {"error", a.error.empty() ? json(nullptr) : json(a.error)}});
  return {{"url", o.url},       {"model", r.model},  {"mode", "agent-replay"}, {"turn_tokens", turn_tokens},
          {"output_len", o.output_len}, {"seed", o.seed}, {"turns", turns}};
}

std::string bench_table(const BenchResult& r) {
  std::string out = fmt::format("{:>6} {:>9} {:>7} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}\n", "conc",
                                "requests", "errors", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50",
                                "ITL p99", "TPOT", "prompt");
  out += fmt::format("{:>6} {:>9} {:>7} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}\n", "", "", "", "", "", "ms",
                     "ms", "ms", "ms", "ms", "tokens");
  for (const BenchLevel& L : r.levels)
    out += fmt::format("{:>6} {:>9} {:>7} {:>8.2f} {:>10.1f} {:>9.1f} {:>9.1f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.0f}\n",
                       L.concurrency, L.requests, L.errors, L.requests_per_s, L.output_tokens_per_s,
                       L.ttft_p50_s * 1e3, L.ttft_p99_s * 1e3, L.itl_p50_s * 1e3, L.itl_p99_s * 1e3,
                       L.tpot_mean_s * 1e3, L.prompt_tokens_mean);
  return out;
}

json bench_json(const BenchServeOptions& o, const BenchResult& r) {
  json lv = json::array();
  for (const BenchLevel& L : r.levels)
    lv.push_back({{"concurrency", L.concurrency},
                  {"requests", L.requests},
                  {"completed", L.completed},
                  {"errors", L.errors},
                  {"error_samples", L.error_samples},
                  {"wall_s", L.wall_s},
                  {"requests_per_s", L.requests_per_s},
                  {"output_tokens", L.output_tokens},
                  {"output_tokens_per_s", L.output_tokens_per_s},
                  {"ttft_ms", {{"p50", L.ttft_p50_s * 1e3}, {"p99", L.ttft_p99_s * 1e3}, {"mean", L.ttft_mean_s * 1e3}}},
                  {"itl_ms", {{"p50", L.itl_p50_s * 1e3}, {"p99", L.itl_p99_s * 1e3}}},
                  {"tpot_ms", {{"mean", L.tpot_mean_s * 1e3}}},
                  {"latency_s", {{"p50", L.latency_p50_s}, {"p99", L.latency_p99_s}}},
                  {"prompt_tokens_mean", L.prompt_tokens_mean}});
  return {{"url", o.url},
          {"model", r.model},
          {"api", o.chat ? "chat" : "completions"},
          {"prompt_len", o.prompt_len},
          {"output_len", o.output_len},
          {"requests_per_level", o.requests},
          {"seed", o.seed},
          {"levels", lv}};
}

}  // namespace moe::serve
