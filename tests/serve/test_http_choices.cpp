// OpenAI's n over loopback HTTP against a FakeEngine whose answer depends on the seed:
// n choices in order, each as the engine answers its own seed (seed + i), streamed as
// interleaved chunks that reassemble to the whole answer; the later choices submitted
// after the first has a token (so the prefix cache holds the prompt); a refused or
// failed choice ends the whole request.
#include "http_test_util.h"

namespace moe::serve::testing {
namespace {

struct Streamed {
  std::vector<std::string> text;      // [choice]
  std::vector<int> finishes;          // [choice]: finish_reason chunks seen
  std::vector<std::string> reason;    // [choice]
  std::vector<int> roles;             // [choice]: role chunks seen (chat)
  json usage;
  int usage_chunks = 0;
  bool done_last = false;
  std::string framing;
};

Streamed read_stream(const std::string& body, int n, bool chat) {
  Streamed s;
  s.text.resize(size_t(n));
  s.finishes.resize(size_t(n));
  s.reason.resize(size_t(n));
  s.roles.resize(size_t(n));
  const std::vector<std::string> ev = sse_payloads(body, &s.framing);
  for (size_t k = 0; k < ev.size(); ++k) {
    if (ev[k] == "[DONE]") {
      s.done_last = k + 1 == ev.size();
      break;
    }
    json c = json::parse(ev[k]);
    if (c.contains("usage") && c["usage"].is_object()) {
      s.usage = c["usage"];
      ++s.usage_chunks;
    }
    for (const json& ch : c["choices"]) {
      const size_t i = ch["index"].get<size_t>();
      EXPECT_LT(i, size_t(n));
      if (i >= size_t(n)) continue;
      if (chat) {
        s.text[i] += ch["delta"].value("content", std::string());
        if (ch["delta"].contains("role")) ++s.roles[i];
      } else {
        s.text[i] += ch["text"].get<std::string>();
      }
      if (ch["finish_reason"].is_string()) {
        ++s.finishes[i];
        s.reason[i] = ch["finish_reason"];
      }
    }
  }
  return s;
}

TEST(HttpChoices, NChoicesAnswerTheirOwnSeedsWholeAndStreamed) {
  TestServer s;
  s.engine.rotate_by_seed = true;
  FakeTokenizer tok;
  const std::vector<int32_t> prompt = tok.ids("abcdefghij");
  const int n = 3;
  const uint64_t seed = 21;
  for (bool chat : {false, true}) {
    json body = {{"max_tokens", 7}, {"seed", seed}, {"n", n}};
    if (chat) body["messages"] = {{{"role", "user"}, {"content", "abc"}}};
    else body["prompt"] = prompt;
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const size_t log0 = s.engine.submit_log().size();
    Reply whole = post(s, path, body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    json w = whole.json_body();
    ASSERT_EQ(w["choices"].size(), size_t(n)) << w.dump();
    const int64_t P = w["usage"]["prompt_tokens"];
    EXPECT_EQ(w["usage"]["completion_tokens"], 7 * n);
    EXPECT_EQ(w["usage"]["total_tokens"], P + 7 * n);
    // The choices came to the engine with seeds seed, seed + 1, ..., and the later
    // ones only after the first had produced a token.
    const auto log = s.engine.submit_log();
    ASSERT_EQ(log.size(), log0 + size_t(n));
    for (int i = 0; i < n; ++i) EXPECT_EQ(log[log0 + size_t(i)].seed, seed + uint64_t(i));
    for (int i = 1; i < n; ++i) EXPECT_GT(log[log0 + size_t(i)].emitted_before, log[log0].emitted_before);

    std::vector<std::string> texts;
    for (int i = 0; i < n; ++i) {
      const json& ch = w["choices"][size_t(i)];
      EXPECT_EQ(ch["index"], i);
      EXPECT_EQ(ch["finish_reason"], "length");
      texts.push_back(chat ? ch["message"]["content"].get<std::string>() : ch["text"].get<std::string>());
      if (!chat) {
        EXPECT_EQ(texts.back(), fake_output(prompt, 7, true, (seed + uint64_t(i)) % prompt.size())) << i;
      }
    }
    EXPECT_NE(texts[0], texts[1]) << "different seeds, different answers";

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Reply streamed = post(s, path, body);
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    const Streamed st = read_stream(streamed.body, n, chat);
    EXPECT_EQ(st.framing, "");
    EXPECT_TRUE(st.done_last);
    EXPECT_EQ(st.usage_chunks, 1);
    EXPECT_EQ(st.usage, w["usage"]);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(st.text[size_t(i)], texts[size_t(i)]) << "choice " << i;
      EXPECT_EQ(st.finishes[size_t(i)], 1) << "choice " << i;
      EXPECT_EQ(st.reason[size_t(i)], "length");
      if (chat) {
        EXPECT_EQ(st.roles[size_t(i)], 1) << "choice " << i;
      }
    }
  }
  EXPECT_TRUE(s.engine.wait_idle());
}

// A later choice the engine refuses (its queue is full) ends the request with the
// engine's 503, and the first choice, already running, is cancelled.
TEST(HttpChoices, ARefusedChoiceCancelsTheOthers) {
  TestServer s;
  s.engine.max_active = 1;
  s.engine.slow_ms = 20;
  const json body = {{"prompt", "abc"}, {"max_tokens", 50}, {"n", 2}};
  Reply whole = post(s, "/v1/completions", body);
  EXPECT_EQ(whole.status, 503) << whole.body;
  EXPECT_TRUE(is_openai_error(whole.body));
  EXPECT_NE(whole.body.find("queue is full"), std::string::npos) << whole.body;
  ASSERT_TRUE(s.engine.wait_idle());
  EXPECT_EQ(s.engine.cancelled, 1) << "the first choice stopped before its 50 tokens";

  json sb = body;
  sb["stream"] = true;
  Reply st = post(s, "/v1/completions", sb);
  EXPECT_EQ(st.status, 200) << "the status went out with the first event";
  const std::vector<std::string> ev = sse_payloads(st.body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_TRUE(is_openai_error(ev[ev.size() - 2])) << ev[ev.size() - 2];
  ASSERT_TRUE(s.engine.wait_idle());
  EXPECT_EQ(s.engine.cancelled, 2);
}

// One choice failing in the engine fails the request: 503 whole, an error event streamed.
TEST(HttpChoices, AFailedChoiceFailsTheRequest) {
  TestServer s;
  s.engine.fail_after = 3;
  const json body = {{"prompt", "abc"}, {"max_tokens", 10}, {"n", 3}};
  Reply whole = post(s, "/v1/completions", body);
  EXPECT_EQ(whole.status, 503) << whole.body;
  EXPECT_NE(whole.body.find("rank 1 stopped answering"), std::string::npos) << whole.body;
  json sb = body;
  sb["stream"] = true;
  Reply st = post(s, "/v1/completions", sb);
  EXPECT_EQ(st.status, 200);
  const std::vector<std::string> ev = sse_payloads(st.body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_TRUE(is_openai_error(ev[ev.size() - 2])) << ev[ev.size() - 2];
  EXPECT_TRUE(s.engine.wait_idle());
}

}  // namespace
}  // namespace moe::serve::testing
