// Helpers of the HTTP tests: a server on a free loopback port in front of a FakeEngine,
// clients (httplib, raw sockets, curl) and an SSE parser.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fake_engine.h"
#include "serve/http_server.h"

namespace moe::serve::testing {

using json = nlohmann::ordered_json;  // as the server writes it: OpenAI's key order

inline constexpr const char* kModel = "fake-model";

struct TestServer {
  explicit TestServer(ServerOptions o = {}, int64_t max_model_len = 512) : engine(max_model_len) {
    o.host = "127.0.0.1";
    o.port = 0;
    if (o.served_model_name.empty()) o.served_model_name = kModel;
    server = std::make_unique<HttpServer>(engine, o);
    server->start();
  }
  ~TestServer() { server->stop(); }
  int port() const { return server->port(); }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port());
    c->set_connection_timeout(std::chrono::seconds(5));
    c->set_read_timeout(std::chrono::seconds(20));
    c->set_write_timeout(std::chrono::seconds(20));
    c->set_tcp_nodelay(true);
    return c;
  }
  FakeEngine engine;
  std::unique_ptr<HttpServer> server;
};

struct Reply {
  int status = 0;  // 0: no HTTP response (connection error)
  std::string body;
  json json_body() const { return json::parse(body, nullptr, false); }
};

inline Reply post(const TestServer& s, const std::string& path, const std::string& body,
                  const httplib::Headers& headers = {}) {
  auto res = s.client()->Post(path.c_str(), headers, body, "application/json");
  if (!res) return {};
  return {res->status, res->body};
}
inline Reply post(const TestServer& s, const std::string& path, const json& body, const httplib::Headers& headers = {}) {
  return post(s, path, body.dump(), headers);
}
inline Reply post(const TestServer& s, const std::string& path, const char* body, const httplib::Headers& headers = {}) {
  return post(s, path, std::string(body), headers);
}
inline Reply get(const TestServer& s, const std::string& path, const httplib::Headers& headers = {}) {
  auto res = s.client()->Get(path.c_str(), headers);
  if (!res) return {};
  return {res->status, res->body};
}

// The events of an SSE body: each "data: X" payload, in order (X as text). Checks the
// framing strictly: nothing but "data: ...\n\n" events.
inline std::vector<std::string> sse_payloads(const std::string& body, std::string* framing_error = nullptr) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos || body.compare(pos, 6, "data: ") != 0 ||
        body.find('\n', pos) != end) {
      if (framing_error) *framing_error = "bad event at byte " + std::to_string(pos) + ": " + body.substr(pos, 80);
      return out;
    }
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

// The text a FakeEngine generates: the prompt's ids again, cyclically, from id `shift`
// (FakeEngine::rotate_by_seed: the request's seed mod the prompt's length).
inline std::string fake_output(const std::vector<int32_t>& prompt, int64_t n, bool skip_special = true,
                               uint64_t shift = 0) {
  FakeTokenizer tok;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(prompt[(size_t(i) + shift) % prompt.size()]);
  text::DecodeOptions o;
  o.skip_special_tokens = skip_special;
  return tok.decode(ids, o);
}

// A blocking loopback TCP socket with receive/send timeouts; -1 if it cannot connect.
inline int raw_connect(int port, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{long(timeout.count() / 1000), long(timeout.count() % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool raw_send(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Reads until the peer closes, the receive timeout passes or `limit` bytes came.
inline std::string raw_read_all(int fd, size_t limit = 1 << 20) {
  std::string out;
  char buf[4096];
  while (out.size() < limit) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

// Runs a shell command (curl), returns its stdout.
inline std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ::pclose(p);
  return out;
}

// An OpenAI error body: {"error": {"message": non-empty, "type", "param", "code"}}.
inline ::testing::AssertionResult is_openai_error(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("error") || !j["error"].is_object())
    return ::testing::AssertionFailure() << "not an OpenAI error body: " << body.substr(0, 300);
  const json& e = j["error"];
  for (const char* k : {"message", "type", "param", "code"})
    if (!e.contains(k)) return ::testing::AssertionFailure() << "error has no '" << k << "': " << body;
  if (!e["message"].is_string() || e["message"].get<std::string>().empty())
    return ::testing::AssertionFailure() << "empty error message: " << body;
  return ::testing::AssertionSuccess();
}

}  // namespace moe::serve::testing
