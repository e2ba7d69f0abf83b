// The OpenAI-compatible HTTP server in front of an Engine (cpp-httplib).
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health
// (503 until the engine is ready, or once it failed), GET /metrics (Prometheus text:
// this layer's series, then Engine::metrics()). Anything else: 404, or 405 for a known
// path with the wrong method, always in OpenAI's error shape. With an API key, /v1/*
// needs "Authorization: Bearer <key>" (401 otherwise); /health and /metrics stay open
// for probes and scrapers, as in vLLM.
//
// Hostile clients: bodies over max_body_bytes get 413 (Content-Length or chunked);
// a client that stops sending mid-request is cut after read_timeout; connections get a
// thread each from a pool that grows to max_threads, so idle or dropped connections do
// not starve the others; streaming responses notice a client that went away within
// ~50 ms and cancel its request. A non-streaming request notices it too (the socket is
// polled while the engine works), so the engine never generates for nobody. (A client
// that half-closes its socket after sending the request looks gone, as it does to
// httplib's own check.)
//
// Around cpp-httplib 0.11: the listen backlog is raised from its 5 to 1024 (a burst of
// clients would otherwise wait a second per SYN retransmit), and the port is bound
// without SO_REUSEPORT (which would let a second server share it silently). Limits that
// remain: a client that trickles a byte per read timeout holds one thread for as long
// as it likes (there is no whole-request deadline), and a request line or header line
// is read whole before its length is checked, so an endless line costs memory. Put a
// proxy in front of the server when it faces the open internet.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "serve/engine.h"
#include "serve/openai.h"

namespace moe::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port; port() tells which
  std::string served_model_name;   // the "model" requests name and /v1/models lists
  std::string api_key;             // non-empty: /v1/* need "Authorization: Bearer <key>"
  size_t max_body_bytes = 8 << 20;  // larger request bodies get 413
  int threads = 16;                // connection threads started at once
  int max_threads = 512;           // connections served at once; more wait for a thread
  std::chrono::milliseconds read_timeout{10000};   // a client silent this long mid-request is cut
  std::chrono::milliseconds write_timeout{10000};  // a client not reading this long is cut
  std::chrono::seconds keep_alive_timeout{5};      // idle keep-alive connections close after this
  std::chrono::milliseconds drain_timeout{30000};  // stop(): in-flight requests may finish this long
  SamplingDefaults defaults;       // sampling fields a request leaves out
  // Chat replies' parsers (serve/parsers/detect.h): auto picks them from the engine's
  // chat template and tokenizer at start().
  std::string reasoning_parser = "auto";  // auto, deepseek_r1, qwen3, none
  std::string tool_call_parser = "auto";  // auto, hermes, qwen3_coder, deepseek_v3, deepseek_v31, mistral, none
  // Structured outputs' grammar compiler (serve/grammar/); must outlive the server.
  // null: response_format json_object / json_schema and forced tool_choice get 400.
  const grammar::Compiler* grammar = nullptr;
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerOptions opt);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Chooses the reply parsers (moe::Error for an unknown parser name), binds (moe::Error
  // naming host:port when it cannot) and serves on background threads.
  void start();
  // Graceful: new requests get 503 at once; in-flight ones may finish within
  // drain_timeout, then the rest are cancelled (a stream gets an error event) and every
  // connection is closed. Idempotent; returns when the server's threads are gone.
  void stop();
  bool running() const;
  int port() const;  // the bound port (after start())
  // The parsers start() chose, in words ("reasoning parser qwen3 (auto), ...").
  std::string parsers_summary() const;

  // The Prometheus text /metrics answers.
  std::string metrics_text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::serve
