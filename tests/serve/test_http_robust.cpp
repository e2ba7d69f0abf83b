// Hostile and heavy clients: slow headers, a thousand dropped connections, 64 streams
// with some leaving mid-way, a non-streaming client that leaves, graceful stop; and the
// bench-serve load generator against the fake server.
#include <atomic>
#include <future>
#include <thread>

#include "http_test_util.h"
#include "serve/bench_client.h"

namespace moe::serve::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(HttpRobust, SlowHeadersClientIsCutOthersAreServed) {
  ServerOptions o;
  o.read_timeout = milliseconds(1000);
  o.keep_alive_timeout = std::chrono::seconds(1);
  TestServer s(o);
  const int fd = raw_connect(s.port(), milliseconds(8000));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(raw_send(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"));  // ... and nothing more
  const auto t0 = Clock::now();
  // Meanwhile others are served.
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(post(s, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 2}}).status, 200);
  // The server gives up on the slow one after its read timeout: an error answer and/or
  // the connection closed, well before the client's own 8 s receive timeout.
  const std::string got = raw_read_all(fd);
  const double waited = since(t0);
  ::close(fd);
  EXPECT_LT(waited, 5.0) << "the slow client was not cut";
  EXPECT_GE(waited, 0.5);
  EXPECT_TRUE(got.empty() || got.rfind("HTTP/1.1 400", 0) == 0) << got;
}

TEST(HttpRobust, ThousandDroppedConnectionsDoNotStarveOthers) {
  ServerOptions o;
  o.threads = 4;
  o.max_threads = 64;
  TestServer s(o);
  // 1000 connections in batches of 100 held open at once, then dropped: some say
  // nothing, some send half a request, some reset (SO_LINGER 0).
  int opened = 0;
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<int> fds;
    for (int i = 0; i < 100; ++i) {
      const int fd = raw_connect(s.port(), milliseconds(3000));
      if (fd < 0) continue;
      ++opened;
      if (i % 3 == 1) raw_send(fd, "POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro");
      if (i % 3 == 2) {
        linger l{1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      }
      fds.push_back(fd);
    }
    for (int fd : fds) ::close(fd);
  }
  EXPECT_GE(opened, 990) << "the listen backlog refused connections";
  const auto t0 = Clock::now();
  Reply r = post(s, "/v1/completions", json{{"prompt", "ok"}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LT(since(t0), 5.0) << "a normal request waited behind dropped connections";
  EXPECT_EQ(get(s, "/health").status, 200);
}

TEST(HttpRobust, SixtyFourStreamsSomeDisconnect) {
  TestServer s;
  FakeTokenizer tok;
  constexpr int kClients = 64, kTokens = 40;
  std::vector<std::string> texts(kClients);
  std::vector<int> statuses(kClients, 0);
  std::vector<bool> saw_done(kClients, false);
  std::vector<std::thread> threads;
  auto leaves = [](int i) { return i % 4 == 3; };  // 16 clients hang up after a few events
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto cli = s.client();
      const json body = {{"prompt", tok.ids("client " + std::to_string(i) + " says hi. ")},
                         {"max_tokens", kTokens},
                         {"stream", true}};
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      std::string buf;
      int events = 0;
      req.response_handler = [&](const httplib::Response& res) {
        statuses[i] = res.status;
        return true;
      };
      req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
        buf.append(d, n);
        for (size_t pos; (pos = buf.find("\n\n")) != std::string::npos;) {
          const std::string p = buf.substr(6, pos - 6);
          buf.erase(0, pos + 2);
          ++events;
          if (p == "[DONE]") saw_done[i] = true;
          else texts[i] += json::parse(p)["choices"][0]["text"].get<std::string>();
        }
        return !(leaves(i) && events >= 3);  // false: the client closes the connection
      };
      cli->send(req);
    });
  for (auto& t : threads) t.join();
  int left = 0;
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(statuses[i], 200) << i;
    if (leaves(i)) {
      ++left;
      EXPECT_FALSE(saw_done[i]) << i;
    } else {
      EXPECT_TRUE(saw_done[i]) << i;
      EXPECT_EQ(texts[i], fake_output(tok.ids("client " + std::to_string(i) + " says hi. "), kTokens)) << i;
    }
  }
  // Every stream whose client left was cancelled in the engine (not generated to the end).
  ASSERT_TRUE(s.engine.wait_idle());
  EXPECT_EQ(s.engine.cancelled.load(), left);
  EXPECT_EQ(s.engine.completed.load(), kClients - left);
}

TEST(HttpRobust, NonStreamingClientThatLeavesIsCancelled) {
  TestServer s;
  s.engine.slow_ms = 20;  // 400 tokens: 8 s if nobody cancels
  const int fd = raw_connect(s.port());
  ASSERT_GE(fd, 0);
  const std::string body = json{{"prompt", "abc"}, {"max_tokens", 400}}.dump();
  ASSERT_TRUE(raw_send(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(milliseconds(800));
  ::close(fd);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.engine.wait_idle(std::chrono::seconds(5)));
  EXPECT_LT(since(t0), 2.0);
  EXPECT_EQ(s.engine.cancelled.load(), 1);
}

TEST(HttpRobust, GracefulStopLetsStreamsFinish) {
  ServerOptions o;
  o.drain_timeout = milliseconds(5000);
  TestServer s(o);
  s.engine.slow_ms = 15;  // 30 tokens: ~0.45 s
  auto cli = s.client();
  auto stream = std::async(std::launch::async, [&] {
    return cli->Post("/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 30}, {"stream", true}}.dump(),
                     "application/json");
  });
  for (int i = 0; i < 200 && s.engine.submitted.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(s.engine.submitted.load(), 1);
  auto stopping = std::async(std::launch::async, [&] { s.server->stop(); });
  std::this_thread::sleep_for(milliseconds(100));
  // While draining, new requests are refused with 503.
  Reply late = post(s, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 1}});
  EXPECT_TRUE(late.status == 503 || late.status == 0) << late.status;
  const int health = get(s, "/health").status;
  EXPECT_TRUE(health == 503 || health == 0) << "draining is unhealthy: " << health;
  auto res = stream.get();
  ASSERT_TRUE(res);
  std::vector<std::string> ev = sse_payloads(res->body);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_NE(ev[ev.size() - 2].find("\"finish_reason\":\"length\""), std::string::npos) << "the stream ran to its end";
  stopping.get();
  EXPECT_FALSE(s.server->running());
}

TEST(HttpRobust, StopCancelsWhatOutlivesTheDrain) {
  ServerOptions o;
  o.drain_timeout = milliseconds(200);
  TestServer s(o);
  s.engine.slow_ms = 20;  // 500 tokens: 10 s
  auto cli = s.client();
  auto stream = std::async(std::launch::async, [&] {
    return cli->Post("/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 500}, {"stream", true}}.dump(),
                     "application/json");
  });
  for (int i = 0; i < 200 && s.engine.submitted.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  // An idle keep-alive connection and a half-sent request must not hold stop() either.
  const int idle = raw_connect(s.port());
  const int half = raw_connect(s.port());
  raw_send(half, "GET /health HTTP/1.1\r\nHo");
  const auto t0 = Clock::now();
  s.server->stop();
  EXPECT_LT(since(t0), 3.0);
  auto res = stream.get();
  ASSERT_TRUE(res);
  std::vector<std::string> ev = sse_payloads(res->body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_TRUE(is_openai_error(ev[ev.size() - 2])) << ev[ev.size() - 2];
  ASSERT_TRUE(s.engine.wait_idle());
  EXPECT_EQ(s.engine.cancelled.load(), 1);
  ::close(idle);
  ::close(half);
}

TEST(HttpBench, MeasuresAndChecksAgainstTheFakeServer) {
  TestServer s;
  BenchServeOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(s.port());
  o.concurrency = {1, 4};
  o.requests = 6;
  o.prompt_len = 12;
  o.output_len = 8;
  o.token_lo = FakeTokenizer::kByte0 + 'a';
  o.token_hi = FakeTokenizer::kByte0 + 'z';
  BenchResult result = run_bench_serve(o);
  EXPECT_EQ(result.model, kModel) << "the server's model, from /v1/models";
  ASSERT_EQ(result.levels.size(), 2u);
  for (const BenchLevel& L : result.levels) {
    EXPECT_EQ(L.completed, 6) << (L.error_samples.empty() ? "" : L.error_samples[0]);
    EXPECT_EQ(L.errors, 0);
    EXPECT_EQ(L.output_tokens, 6 * 8);
    EXPECT_EQ(L.prompt_tokens_mean, 12);
    EXPECT_GT(L.ttft_p50_s, 0);
    EXPECT_GT(L.itl_p50_s, 0);
    EXPECT_GE(L.ttft_p99_s, L.ttft_p50_s);
    EXPECT_GT(L.output_tokens_per_s, 0);
  }
  EXPECT_NE(bench_table(result).find("TTFT"), std::string::npos);
  EXPECT_EQ(bench_json(o, result)["levels"].size(), 2u);
  // Chat prompts of words.
  o.chat = true;
  o.concurrency = {2};
  EXPECT_EQ(run_bench_serve(o).levels[0].completed, 6);
  // Requests the server refuses are errors with their reason, not figures.
  o.chat = false;
  o.token_hi = 100000;  // ids past the fake vocabulary: 400
  BenchLevel bad = run_bench_serve(o).levels[0];
  EXPECT_EQ(bad.completed, 0);
  EXPECT_EQ(bad.errors, 6);
  ASSERT_FALSE(bad.error_samples.empty());
  EXPECT_NE(bad.error_samples[0].find("HTTP 400"), std::string::npos) << bad.error_samples[0];
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5);
}

}  // namespace
}  // namespace moe::serve::testing
