// The reply parsers behind the real HTTP server (HttpServer, cpp-httplib), in front of
// an engine that echoes a scripted reply: the user's message is the model's answer. A
// streamed reply, reassembled as a client does (texts appended, tool calls by index),
// must equal the non-streamed one.
//
// The official `openai` client's view of these replies is checked outside the test run
// (the engine and its tests never need Python): `tools/check_openai_client.py live`
// against such a server, and the goldens test_serve_parsers_wire.cpp compares with were
// validated by the client's own models (tools/check_openai_client.py goldens).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "serve/http_test_util.h"

namespace moe::serve::testing {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");

// The template renders the last message alone, then <|im_end|>; kwargs "think" (an
// R1-style template that opens <think>) and enable_thinking false (Qwen3's empty block)
// add what those templates add.
const char* kEchoTemplate =
    "{{ messages[-1].content }}<|im_end|>{% if think is defined and think %}<think>\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}";

// Sends back the prompt's tokens up to <|im_end|>, one every 0.2 ms.
class EchoEngine : public Engine {
 public:
  EchoEngine() : tmpl_(kEchoTemplate, "echo") {}
  ~EchoEngine() override {
    std::lock_guard lk(mu_);
    for (auto& t : threads_) t.join();
  }
  std::shared_ptr<Stream> submit(RequestParams p) override {
    auto s = std::make_shared<Stream>();
    std::lock_guard lk(mu_);
    threads_.emplace_back([this, s, p = std::move(p)] { run(*s, p); });
    return s;
  }
  bool ready() const override { return true; }
  bool failed() const override { return false; }
  int64_t max_model_len() const override { return 8192; }
  const text::Tokenizer& tokenizer() const override { return tok_; }
  const text::ChatTemplate* chat_template() const override { return &tmpl_; }
  std::string metrics() const override { return ""; }

 private:
  void run(Stream& s, const RequestParams& p) {
    text::DecodeOptions o;
    o.skip_special_tokens = p.skip_special_tokens;
    text::TextStream ts(tok_, p.stop, o);
    Finish f = Finish::stop;
    int64_t n = 0;
    for (int32_t id : p.prompt_ids) {
      if (id == 4) break;  // <|im_end|>: the scripted reply is over
      if (n++ == p.max_tokens) {
        f = Finish::length;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      s.append(ts.push(id).text, TokenLogprob{id, -0.5f, {}});
    }
    s.append_text(ts.finish().text);
    s.finish(f);
  }
  FakeTokenizer tok_;
  text::ChatTemplate tmpl_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

// --- over HTTP ---------------------------------------------------------------------

struct EchoServer {
  EchoEngine engine;
  std::unique_ptr<HttpServer> server;
  EchoServer(const std::string& reasoning, const std::string& tools) {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_name = "echo";
    o.reasoning_parser = reasoning;
    o.tool_call_parser = tools;
    server = std::make_unique<HttpServer>(engine, o);
    server->start();
  }
  ~EchoServer() { server->stop(); }
  Reply chat(const json& body) const {
    httplib::Client cl("127.0.0.1", server->port());
    cl.set_read_timeout(std::chrono::seconds(20));
    auto res = cl.Post("/v1/chat/completions", body.dump(), "application/json");
    return res ? Reply{res->status, res->body} : Reply{};
  }
};

// A streamed message put back together as a client does: texts appended, tool calls
// by index (the first delta names the call, later ones append arguments).
json reassemble(const std::string& sse, std::string* finish) {
  json msg = {{"content", ""}, {"reasoning_content", ""}, {"tool_calls", json::array()}};
  for (const std::string& e : sse_payloads(sse)) {
    if (e == "[DONE]") break;
    const json c = json::parse(e);
    if (c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    if (!ch["finish_reason"].is_null()) *finish = ch["finish_reason"];
    const json& d = ch["delta"];
    for (const char* k : {"content", "reasoning_content"})
      if (d.contains(k) && d[k].is_string()) msg[k] = msg[k].get<std::string>() + d[k].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    for (const json& tc : d["tool_calls"]) {
      const size_t i = tc["index"];
      if (i == msg["tool_calls"].size())
        msg["tool_calls"].push_back({{"id", tc["id"]}, {"type", tc["type"]}, {"function", {{"name", tc["function"]["name"]}, {"arguments", ""}}}});
      json& fn = msg["tool_calls"][i]["function"];
      fn["arguments"] = fn["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
    }
  }
  return msg;
}

TEST(ServeParsersWire, StreamedHttpRepliesReassembleToTheWholeOnes) {
  const std::vector<std::tuple<std::string, std::string, std::string, int>> cases = {
      // reasoning parser, tool parser, scripted reply, tool calls expected
      {"qwen3", "hermes",
       "<think>\nHmm.\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"}\"}]}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", 2},
      {"none", "qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx y\n</parameter>\n</function>\n</tool_call>", 1},
      {"none", "deepseek_v3",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>"
       "<｜tool▁calls▁end｜>", 1},
      {"none", "mistral", "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"ü\"}}]", 1},
      {"qwen3", "hermes", "<think>only thinking, then plain text</think>No call: <tool_call>{oops}</tool_call>", 0},
  };
  for (const auto& [reasoning, tools, reply, n_calls] : cases) {
    EchoServer s(reasoning, tools);
    json body = {{"model", "echo"}, {"messages", {{{"role", "user"}, {"content", reply}}}}, {"tools", kTools}};
    const Reply whole = s.chat(body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    const json w = json::parse(whole.body)["choices"][0];
    body["stream"] = true;
    const Reply streamed = s.chat(body);
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    std::string finish;
    const json m = reassemble(streamed.body, &finish);
    EXPECT_EQ(finish, w["finish_reason"]) << reply;
    EXPECT_EQ(w["finish_reason"], n_calls ? "tool_calls" : "stop") << reply;
    EXPECT_EQ(m["content"], w["message"]["content"].is_null() ? json("") : w["message"]["content"]) << reply;
    if (reasoning != "none") {
      const json& r = w["message"]["reasoning_content"];
      EXPECT_EQ(m["reasoning_content"], r.is_null() ? json("") : r) << reply;
    }
    const json wcalls = w["message"].value("tool_calls", json::array());
    ASSERT_EQ(wcalls.size(), size_t(n_calls)) << whole.body;
    ASSERT_EQ(m["tool_calls"].size(), wcalls.size()) << streamed.body;
    for (size_t i = 0; i < wcalls.size(); ++i) {
      EXPECT_EQ(m["tool_calls"][i]["function"], wcalls[i]["function"]);
      EXPECT_EQ(wcalls[i]["type"], "function");
      EXPECT_TRUE(json::parse(wcalls[i]["function"]["arguments"].get<std::string>()).is_object());
      const std::string id = wcalls[i]["id"];
      EXPECT_EQ(id.size(), tools == "mistral" ? 9u : 29u) << id;
    }
  }
}

}  // namespace
}  // namespace moe::serve::testing
