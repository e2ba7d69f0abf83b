// The server over real loopback HTTP against a FakeEngine: routes, whole vs streamed
// answers, SSE framing, every error status, auth, metrics.
#include <regex>
#include <thread>

#include "http_test_util.h"

namespace moe::serve::testing {
namespace {

TEST(HttpServer, ModelsHealthAndUnknownRoutes) {
  TestServer s;
  Reply m = get(s, "/v1/models");
  ASSERT_EQ(m.status, 200) << m.body;
  json j = m.json_body();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], kModel);
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "moe-ep");
  EXPECT_EQ(j["data"][0]["max_model_len"], 512);
  EXPECT_TRUE(j["data"][0]["created"].is_number_integer());

  EXPECT_EQ(get(s, "/health").status, 200);
  s.engine.ready_flag = false;
  Reply h = get(s, "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_TRUE(is_openai_error(h.body));
  Reply busy = post(s, "/v1/completions", json{{"prompt", "a"}});
  EXPECT_EQ(busy.status, 503) << "no generation before the model is ready";
  s.engine.ready_flag = true;
  EXPECT_EQ(get(s, "/health").status, 200);
  s.engine.failed_flag = true;
  EXPECT_EQ(get(s, "/health").status, 503) << "a failed engine is unhealthy";
  EXPECT_EQ(post(s, "/v1/completions", json{{"prompt", "a"}}).status, 503);
  s.engine.failed_flag = false;

  for (const char* path : {"/", "/v1", "/v1/models/", "/v1/embeddings", "/v2/completions"}) {
    Reply r = get(s, path);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_TRUE(is_openai_error(r.body)) << path;
  }
  Reply wrong = get(s, "/v1/completions");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_TRUE(is_openai_error(wrong.body));
  EXPECT_EQ(post(s, "/health", std::string("{}")).status, 405);
  EXPECT_EQ(s.client()->Put("/v1/completions", "{}", "application/json")->status, 405);
  EXPECT_EQ(s.client()->Delete("/v1/models")->status, 405);
}

TEST(HttpServer, PortInUseIsAnError) {
  TestServer a;
  FakeEngine e;
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = a.port();
  o.served_model_name = kModel;
  HttpServer b(e, o);
  EXPECT_THROW(b.start(), moe::Error) << "a second server must not share the port (no SO_REUSEPORT)";
  EXPECT_EQ(get(a, "/health").status, 200);
}

TEST(HttpCompletions, StreamedTextEqualsWholeText) {
  TestServer s;
  FakeTokenizer tok;
  const std::vector<int32_t> prompt = tok.ids("Hello, world! ");
  for (bool chat : {false, true}) {
    json body = {{"model", kModel}, {"max_tokens", 23}, {"seed", 7}};
    if (chat) body["messages"] = {{{"role", "user"}, {"content", "Hello"}}};
    else body["prompt"] = prompt;
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    Reply whole = post(s, path, body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    json w = whole.json_body();
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Reply streamed = post(s, path, body);
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    std::string framing, text, finish;
    json usage;
    for (const std::string& p : sse_payloads(streamed.body, &framing)) {
      if (p == "[DONE]") break;
      json c = json::parse(p);
      if (c.contains("usage") && c["usage"].is_object()) usage = c["usage"];
      if (c["choices"].empty()) continue;
      const json& ch = c["choices"][0];
      text += chat ? ch["delta"].value("content", std::string()) : ch["text"].get<std::string>();
      if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    }
    EXPECT_EQ(framing, "");
    const json& wc = w["choices"][0];
    const std::string whole_text = chat ? wc["message"]["content"] : wc["text"];
    EXPECT_EQ(text, whole_text) << (chat ? "chat" : "completions");
    EXPECT_EQ(finish, "length");
    EXPECT_EQ(wc["finish_reason"], "length");
    EXPECT_EQ(usage, w["usage"]);
    EXPECT_EQ(w["usage"]["completion_tokens"], 23);
    if (!chat) {
      EXPECT_EQ(whole_text, fake_output(prompt, 23));
      EXPECT_EQ(w["usage"]["prompt_tokens"], int64_t(prompt.size()));
      EXPECT_EQ(w["usage"]["total_tokens"], int64_t(prompt.size()) + 23);
    }
  }
}

TEST(HttpCompletions, StopStringsAndEosFinishWithStop) {
  TestServer s;
  FakeTokenizer tok;
  Reply r = post(s, "/v1/completions", json{{"prompt", tok.ids("abcdefgh")}, {"max_tokens", 20}, {"stop", {"fg", "zz"}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json_body()["choices"][0]["text"], "abcde");
  EXPECT_EQ(r.json_body()["choices"][0]["finish_reason"], "stop");
  // The prompt's </s> comes back as EOS: stop, unless ignore_eos.
  std::vector<int32_t> with_eos = tok.ids("xy");
  with_eos.push_back(2);
  Reply eos = post(s, "/v1/completions", json{{"prompt", with_eos}, {"max_tokens", 20}});
  EXPECT_EQ(eos.json_body()["choices"][0]["text"], "xy");
  EXPECT_EQ(eos.json_body()["choices"][0]["finish_reason"], "stop");
  Reply ign = post(s, "/v1/completions", json{{"prompt", with_eos}, {"max_tokens", 6}, {"ignore_eos", true}});
  EXPECT_EQ(ign.json_body()["choices"][0]["text"], "xyxy");
  EXPECT_EQ(ign.json_body()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ign.json_body()["usage"]["completion_tokens"], 6);
  // Streamed, the stop string is never sent in part.
  Reply st = post(s, "/v1/completions", json{{"prompt", tok.ids("abcdefgh")}, {"max_tokens", 20}, {"stop", "fg"}, {"stream", true}});
  std::string text;
  for (const std::string& p : sse_payloads(st.body))
    if (p != "[DONE]") text += json::parse(p)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, "abcde");
}

TEST(HttpChat, StreamFramingIsExact) {
  TestServer s;
  json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 5}, {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  auto res = s.client()->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(res->get_header_value("Transfer-Encoding"), "chunked");
  // Nothing but "data: <one line>\n\n" events, ending with [DONE].
  EXPECT_TRUE(std::regex_match(res->body, std::regex("(data: [^\n]+\n\n)+"))) << res->body;
  std::string framing;
  std::vector<std::string> ev = sse_payloads(res->body, &framing);
  EXPECT_EQ(framing, "");
  ASSERT_GE(ev.size(), 4u);
  EXPECT_EQ(ev.back(), "[DONE]");
  json first = json::parse(ev[0]), last = json::parse(ev[ev.size() - 2]), fin = json::parse(ev[ev.size() - 3]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"], json::array());
  EXPECT_EQ(last["usage"]["completion_tokens"], 5);
  for (size_t i = 0; i + 1 < ev.size(); ++i) EXPECT_EQ(json::parse(ev[i])["id"], first["id"]);
  // Without include_usage: no usage chunk and no usage keys.
  body.erase("stream_options");
  Reply plain = post(s, "/v1/chat/completions", body);
  for (const std::string& p : sse_payloads(plain.body))
    if (p != "[DONE]") {
      EXPECT_FALSE(json::parse(p).contains("usage")) << p;
    }
}

TEST(HttpChat, WholeResponseWithLogprobs) {
  TestServer s;
  json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}, {"logprobs", true}, {"top_logprobs", 2}};
  Reply r = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], kModel);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp[0]["top_logprobs"][1]["token"], "b");
  EXPECT_EQ(s.engine.last_params().top_logprobs, 2);
  // The prompt is the rendered ChatML, with control tokens and without BOS.
  EXPECT_EQ(s.engine.last_params().prompt_ids.front(), 3);
  // Streamed completions carry their logprobs chunk by chunk.
  Reply st = post(s, "/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 3}, {"logprobs", 0}, {"stream", true}});
  size_t tokens = 0;
  for (const std::string& p : sse_payloads(st.body)) {
    if (p == "[DONE]") continue;
    json c = json::parse(p);
    if (c["choices"][0]["logprobs"].is_object()) tokens += c["choices"][0]["logprobs"]["tokens"].size();
  }
  EXPECT_EQ(tokens, 3u);
}

TEST(HttpErrors, EveryStatusInOpenAiShape) {
  TestServer s({}, 64);
  struct Case {
    const char* what;
    std::string path, body;
    int status;
    std::string param;
  };
  const std::string c = "/v1/completions", chat = "/v1/chat/completions";
  const std::vector<Case> cases = {
      {"malformed JSON", c, "{\"prompt\": ", 400, ""},
      {"truncated JSON", c, R"({"prompt": "abc", "max_tokens": 1)", 400, ""},
      {"not an object", c, "[]", 400, ""},
      {"empty body", c, "", 400, ""},
      {"wrong type", c, R"({"prompt": "a", "max_tokens": "ten"})", 400, "max_tokens"},
      {"wrong type (chat)", chat, R"({"messages": [{"role": "user", "content": "a"}], "temperature": "hot"})", 400,
       "temperature"},
      {"invalid UTF-8", c, "{\"prompt\": \"\xff\"}", 400, ""},
      {"n=9", c, R"({"prompt": "a", "n": 9})", 400, "n"},
      {"unknown model", c, R"({"model": "gpt-4", "prompt": "a"})", 404, "model"},
      {"prompt too long", c, "{\"prompt\": \"" + std::string(70, 'x') + "\"}", 400, "prompt"},
      {"max_tokens past the context", c, R"({"prompt": "a", "max_tokens": 100})", 400, "max_tokens"},
      {"batch", c, R"({"prompt": ["a", "b"]})", 400, "prompt"},
  };
  for (const Case& k : cases) {
    Reply r = post(s, k.path, k.body);
    EXPECT_EQ(r.status, k.status) << k.what << ": " << r.body;
    ASSERT_TRUE(is_openai_error(r.body)) << k.what;
    const json e = r.json_body()["error"];
    if (k.param.empty()) EXPECT_TRUE(e["param"].is_null()) << k.what;
    else EXPECT_EQ(e["param"], k.param) << k.what;
  }
  Reply unknown = post(s, c, R"({"prompt": "a", "max_tokens": 2, "frobnicate": {"x": [1]}})");
  EXPECT_EQ(unknown.status, 200) << "unknown fields are ignored: " << unknown.body;

  // Queue full: the engine's 503 passes through.
  s.engine.max_active = 0;
  Reply full = post(s, c, R"({"prompt": "a"})");
  EXPECT_EQ(full.status, 503);
  EXPECT_TRUE(is_openai_error(full.body));
  s.engine.max_active = 1 << 20;
  // No chat template.
  s.engine.with_template = false;
  Reply nt = post(s, chat, R"({"messages": [{"role": "user", "content": "a"}]})");
  EXPECT_EQ(nt.status, 400);
  EXPECT_NE(nt.body.find("chat template"), std::string::npos);
  s.engine.with_template = true;
}

TEST(HttpErrors, BodiesOverTheLimitGet413) {
  ServerOptions o;
  o.max_body_bytes = 1 << 20;
  TestServer s(o);
  const std::string big = "{\"prompt\": \"" + std::string(10 << 20, 'x') + "\"}";  // 10 MB
  Reply r = post(s, "/v1/completions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(is_openai_error(r.body));
  // Chunked bodies are held to the limit too (httplib checks only Content-Length).
  auto res = s.client()->Post(
      "/v1/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset >= big.size()) {
          sink.done();
          return true;
        }
        return sink.write(big.data() + offset, std::min<size_t>(64 << 10, big.size() - offset));
      },
      "application/json");
  if (res) {
    EXPECT_EQ(res->status, 413);  // (or the server closed the connection while the client still sent)
  }
  // curl asks first (Expect: 100-continue) and hears 413 before uploading.
  const std::string file = ::testing::TempDir() + "/moe_serve_big_body.json";
  {
    FILE* f = fopen(file.c_str(), "wb");
    ASSERT_TRUE(f);
    fwrite(big.data(), 1, big.size(), f);
    fclose(f);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out = run_command("curl -s -m 20 -w '\\n%{http_code}' -H 'Content-Type: application/json' "
                                      "--data-binary @" + file + " http://127.0.0.1:" + std::to_string(s.port()) +
                                      "/v1/completions");
  std::remove(file.c_str());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 8.0)
      << "the answer has a Content-Length: curl need not wait for the connection to close";
  ASSERT_GE(out.size(), 4u);
  EXPECT_EQ(out.substr(out.size() - 3), "413") << out;
  EXPECT_TRUE(is_openai_error(out.substr(0, out.rfind('\n'))));
  // The server is fine afterwards.
  EXPECT_EQ(post(s, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 1}}).status, 200);
}

TEST(HttpErrors, CurlSeesOpenAiErrorsAndStreams) {
  TestServer s;
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port());
  std::string out = run_command("curl -s -m 10 -w '\\n%{http_code}' -H 'Content-Type: application/json' -d '{\"prompt\":' " +
                                url + "/v1/completions");
  ASSERT_GE(out.size(), 4u) << "curl did not run";
  EXPECT_EQ(out.substr(out.size() - 3), "400") << out;
  EXPECT_TRUE(is_openai_error(out.substr(0, out.rfind('\n'))));
  std::string stream = run_command(
      "curl -s -N -m 10 -H 'Content-Type: application/json' -d '{\"prompt\":\"hi\",\"max_tokens\":4,\"stream\":true}' " +
      url + "/v1/completions");
  std::string framing;
  std::vector<std::string> ev = sse_payloads(stream, &framing);
  EXPECT_EQ(framing, "");
  ASSERT_FALSE(ev.empty()) << stream;
  EXPECT_EQ(ev.back(), "[DONE]");
}

TEST(HttpAuth, BearerKeyGuardsTheApiOnly) {
  ServerOptions o;
  o.api_key = "sk-test-123";
  TestServer s(o);
  const json body = {{"prompt", "a"}, {"max_tokens", 1}};
  Reply none = post(s, "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_TRUE(is_openai_error(none.body));
  EXPECT_EQ(post(s, "/v1/completions", body, {{"Authorization", "Bearer sk-test-12"}}).status, 401);
  EXPECT_EQ(post(s, "/v1/completions", body, {{"Authorization", "sk-test-123"}}).status, 401);
  EXPECT_EQ(get(s, "/v1/models").status, 401);
  EXPECT_EQ(post(s, "/v1/completions", body, {{"Authorization", "Bearer sk-test-123"}}).status, 200);
  EXPECT_EQ(get(s, "/v1/models", {{"Authorization", "Bearer sk-test-123"}}).status, 200);
  EXPECT_EQ(get(s, "/v1/models", {{"Authorization", "bearer sk-test-123"}}).status, 200) << "the scheme is case-insensitive";
  EXPECT_EQ(get(s, "/v1/models", {{"Authorization", "Bearer sk-test-1234"}}).status, 401);
  EXPECT_EQ(get(s, "/health").status, 200) << "probes need no key";
  EXPECT_EQ(get(s, "/metrics").status, 200) << "scrapers need no key";
}

TEST(HttpEngine, FailureMidRequestIs503OrAnErrorEvent) {
  TestServer s;
  s.engine.fail_after = 2;
  Reply whole = post(s, "/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 10}});
  EXPECT_EQ(whole.status, 503);
  EXPECT_TRUE(is_openai_error(whole.body));
  EXPECT_NE(whole.body.find("rank 1 stopped answering"), std::string::npos) << whole.body;
  Reply st = post(s, "/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 10}, {"stream", true}});
  EXPECT_EQ(st.status, 200) << "the status went out with the first event";
  std::vector<std::string> ev = sse_payloads(st.body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_TRUE(is_openai_error(ev[ev.size() - 2])) << ev[ev.size() - 2];
}

// Every line is "# HELP name text", "# TYPE name kind" or "name{labels} value".
void expect_prometheus_text(const std::string& text) {
  const std::regex help(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*)"), type(R"(# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram|summary|untyped))");
  const std::regex sample(R"([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? [-+]?([0-9.eE+-]+|Inf|NaN))");
  size_t pos = 0, lines = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    ASSERT_NE(end, std::string::npos) << "the text must end with a newline";
    const std::string line = text.substr(pos, end - pos);
    EXPECT_TRUE(std::regex_match(line, help) || std::regex_match(line, type) || std::regex_match(line, sample)) << line;
    pos = end + 1;
    ++lines;
  }
  EXPECT_GT(lines, 10u);
}

double metric_value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(HttpServer, MetricsParseAndCount) {
  TestServer s;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post(s, "/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 4}}).status, 200);
  ASSERT_EQ(post(s, "/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 4}, {"stream", true}}).status, 200);
  EXPECT_EQ(post(s, "/v1/completions", std::string("{")).status, 400);
  EXPECT_EQ(get(s, "/nope").status, 404);
  auto res = s.client()->Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  const std::string& t = res->body;
  expect_prometheus_text(t);
  EXPECT_EQ(metric_value(t, R"(moe_ep_requests_total{route="/v1/completions",status="200"})"), 4);
  EXPECT_EQ(metric_value(t, R"(moe_ep_requests_total{route="/v1/completions",status="400"})"), 1);
  EXPECT_EQ(metric_value(t, R"(moe_ep_requests_total{route="other",status="404"})"), 1);
  EXPECT_EQ(metric_value(t, "moe_ep_prompt_tokens_total"), 4 * 3);
  EXPECT_EQ(metric_value(t, "moe_ep_generation_tokens_total"), 4 * 4);
  EXPECT_EQ(metric_value(t, "moe_ep_time_to_first_token_seconds_count"), 4);
  EXPECT_EQ(metric_value(t, "moe_ep_inter_token_latency_seconds_count"), 4 * 3);
  EXPECT_EQ(metric_value(t, "moe_ep_request_duration_seconds_count"), 4);
  EXPECT_EQ(metric_value(t, R"(moe_ep_time_to_first_token_seconds_bucket{le="+Inf"})"), 4);
  EXPECT_NE(t.find("fake_engine_requests_running 0"), std::string::npos) << "the engine's series follow";
}

}  // namespace
}  // namespace moe::serve::testing
