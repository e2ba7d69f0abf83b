#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <strings.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "serve/choices.h"
#include "serve/http_conn.h"
#include "serve/http_metrics.h"
#include "serve/openai.h"

namespace moe::serve {

using json = Json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a waiting request looks at its client
constexpr const char* kJson = "application/json";
constexpr int kBacklog = 1024;  // pending connections the kernel holds (capped by net.core.somaxconn)

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void send_error(httplib::Response& res, const ServeError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_json(e)), kJson);
}

ServeError server_error(int status, std::string message) {
  return ServeError{status, status >= 500 ? "server_error" : "invalid_request_error", std::move(message), "", ""};
}

// Constant-time comparison: the API key must not leak through response timing.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= (unsigned char)(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

enum class Route { chat, completions, models, health, metrics, tokenize, detokenize };

struct RouteInfo {
  const char* path;
  const char* method;
  Route route;
  bool auth;  // needs the API key
};

constexpr RouteInfo kRoutes[] = {
    {"/v1/chat/completions", "POST", Route::chat, true},
    {"/v1/completions", "POST", Route::completions, true},
    {"/v1/models", "GET", Route::models, true},
    {"/tokenize", "POST", Route::tokenize, true},
    {"/detokenize", "POST", Route::detokenize, true},
    {"/health", "GET", Route::health, false},
    {"/metrics", "GET", Route::metrics, false},
};

const RouteInfo* find_route(const std::string& path) {
  for (const auto& r : kRoutes)
    if (path == r.path) return &r;
  return nullptr;
}

// The metrics label of a path: known routes, else "other" (arbitrary paths must not
// create new series).
std::string route_label(const std::string& path) {
  const RouteInfo* r = find_route(path);
  return r ? r->path : "other";
}

// Time to first token and between tokens, as the client receives them.
struct TokenClock {
  Clock::time_point arrival, last;
  bool any = false;
  void tokens(size_t n, HttpMetrics& m) {
    if (n == 0) return;
    const auto now = Clock::now();
    if (!any) {
      any = true;
      m.time_to_first_token.observe(std::chrono::duration<double>(now - arrival).count());
      m.inter_token_latency.observe(0, n - 1);  // the client got these together with the first
    } else {
      // n tokens arriving together after a gap: n intervals of gap / n.
      m.inter_token_latency.observe(std::chrono::duration<double>(now - last).count() / double(n), n);
    }
    last = now;
  }
};

// Generation requests being answered; stop() waits for them to end.
class FlightCount {
 public:
  explicit FlightCount(std::atomic<int64_t>& gauge) : gauge_(gauge) {}
  class Guard {
   public:
    explicit Guard(FlightCount& c) : c_(c) {
      std::lock_guard lk(c_.mu_);
      ++c_.n_;
      ++c_.gauge_;
    }
    ~Guard() {
      {
        std::lock_guard lk(c_.mu_);
        --c_.n_;
        --c_.gauge_;
      }
      c_.cv_.notify_all();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    FlightCount& c_;
  };
  std::unique_ptr<Guard> enter() { return std::make_unique<Guard>(*this); }
  bool wait_zero(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return n_ == 0; });
  }

 private:
  std::atomic<int64_t>& gauge_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_ = 0;
};
using Flight = FlightCount::Guard;

// One streamed response: lives in the content provider and its releaser.
struct StreamState {
  ApiRequest req;
  std::unique_ptr<ChoiceGroup> group;
  ChunkWriter writer;  // refers to req
  TokenClock clock;
  std::unique_ptr<Flight> flight;
  std::vector<bool> finished;  // [n]: the choice's finish chunk went out
  bool started = false, ended = false, recorded = false;
  StreamState(ApiRequest r, std::unique_ptr<ChoiceGroup> g, ResponseMeta meta, const text::Tokenizer& tok,
              Clock::time_point arrival, std::unique_ptr<Flight> fl)
      : req(std::move(r)), group(std::move(g)), writer(req, std::move(meta), tok), clock{arrival, arrival},
        flight(std::move(fl)), finished(size_t(group->size()), false) {}
};

size_t token_count(const std::vector<Delta>& ds) {
  size_t n = 0;
  for (const Delta& d : ds) n += d.tokens.size();
  return n;
}

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  ServerOptions opt;
  httplib::Server svr;
  HttpMetrics metrics;
  std::thread listener;
  std::atomic<bool> listener_done{false};
  int port = -1;
  int listen_fd = -1;
  int64_t created = 0;
  std::atomic<bool> started{false}, draining{false}, cancel_all{false}, stopped{false};
  std::mutex stop_mu;
  FlightCount flights{metrics.in_flight};
  parsers::ParserChoice parsers;  // set by start(), read-only after

  Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)) {}

  void install();
  // "Authorization: Bearer <key>" (the scheme is case-insensitive, RFC 7235).
  bool authorized(const std::string& header) const {
    return header.size() > 7 && strncasecmp(header.c_str(), "Bearer ", 7) == 0 &&
           same_secret(header.substr(7), opt.api_key);
  }
  ServeError too_large() const {
    return ServeError{413, "invalid_request_error",
                      fmt::format("the request body is larger than {} bytes", opt.max_body_bytes), "",
                      "request_too_large"};
  }
  void dispatch(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader* reader);
  int read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader* reader,
                std::string* body);
  ModelContext model_context() const;  // what checking a request needs (503 while loading)
  void generate(Api api, const httplib::Request& req, httplib::Response& res, const std::string& body,
                Clock::time_point arrival);
  void answer_whole(const httplib::Request& req, httplib::Response& res, const ApiRequest& r, ChoiceGroup& g,
                    ResponseMeta meta, Clock::time_point arrival, std::unique_ptr<Flight> fl);
  void record(StreamState& st, int status);  // a streamed request's metrics, once
  void answer_stream(httplib::Response& res, ApiRequest r, std::unique_ptr<ChoiceGroup> g, ResponseMeta meta,
                     Clock::time_point arrival, std::unique_ptr<Flight> fl);
  // The 503 for a group whose choice failed (the engine's error) or was cancelled.
  static ServeError choice_error(const ChoiceGroup& g);
  std::string metrics_text() const { return metrics.text() + engine.metrics(); }
};

void HttpServer::Impl::install() {
  svr.new_task_queue = [this] {
    return make_connection_pool(size_t(std::max(1, opt.threads)), size_t(std::max(opt.threads, opt.max_threads)))
        .release();
  };
  auto us = [](std::chrono::milliseconds d) { return std::chrono::duration_cast<std::chrono::microseconds>(d); };
  svr.set_read_timeout(us(opt.read_timeout));
  svr.set_write_timeout(us(opt.write_timeout));
  svr.set_keep_alive_timeout(std::max<time_t>(1, time_t(opt.keep_alive_timeout.count())));
  svr.set_keep_alive_max_count(1000);
  svr.set_payload_max_length(opt.max_body_bytes);  // Content-Length bodies; chunked ones: read_body
  svr.set_tcp_nodelay(true);  // SSE events are small: Nagle would hold each one back
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port
  // and silently take half the connections; SO_REUSEADDR alone still allows a restart
  // while old connections sit in TIME_WAIT.
  svr.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = sock;
  });

  // Every method and path comes to dispatch(), so unknown paths get 404, wrong methods
  // 405 and bodies are read (or drained) under the same limit.
  auto plain = [this](const httplib::Request& req, httplib::Response& res) { dispatch(req, res, nullptr); };
  auto with_body = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
    dispatch(req, res, &rd);
  };
  svr.Get(".*", plain);
  svr.Options(".*", plain);
  svr.Post(".*", with_body);
  svr.Put(".*", with_body);
  svr.Patch(".*", with_body);
  svr.Delete(".*", with_body);

  // A client that asks before sending a large body (curl does above 1 MB) hears 413 at
  // once instead of after uploading it.
  svr.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.has_header("Content-Length") && req.get_header_value<uint64_t>("Content-Length") > opt.max_body_bytes) {
      send_error(res, too_large());
      res.set_header("Connection", "close");
      metrics.request(route_label(req.path), 413);
      return 413;
    }
    return 100;
  });
  // Errors httplib answers itself (a bad request line, a header too long): OpenAI shape.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    // Ours already (dispatch's errors, the 100-continue refusal): keep the body. Handled
    // either way, because only then does httplib add Content-Length to an answer it
    // writes outside routing, and a client would otherwise wait for the connection to close.
    if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Handled;
    metrics.request("other", res.status);
    res.set_content(dump_json(error_json(server_error(res.status, fmt::format("HTTP error {} ({} {})", res.status,
                                                                              req.method, req.path)))),
                    kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  // Last resort: dispatch() catches everything, so this is a bug if it runs.
  svr.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, server_error(500, "internal server error: " + what));
    metrics.request(route_label(req.path), 500);
  });
}

// 0 and *body filled, or the status to answer with (the body was too large or broken).
int HttpServer::Impl::read_body(const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader* reader, std::string* body) {
  // HTTP/1.1: without Content-Length or chunked transfer encoding there is no body.
  // (httplib would read until the client closes: a client could hold the thread.)
  if (!reader ||
      (!req.has_header("Content-Length") && strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0))
    return 0;
  bool too_big = false;
  const bool ok = (*reader)([&](const char* data, size_t n) {
    if (body->size() + n > opt.max_body_bytes) {
      too_big = true;  // chunked bodies: httplib checks only Content-Length against the limit
      return false;
    }
    body->append(data, n);
    return true;
  });
  if (ok) return 0;
  if (too_big || res.status == 413) return 413;
  return 400;
}

void HttpServer::Impl::dispatch(const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader* reader) {
  const auto arrival = Clock::now();
  const RouteInfo* route = find_route(req.path);
  const std::string label = route ? route->path : "other";
  try {
    std::string body;
    // The body is read (or drained, for requests refused below) first, so a keep-alive
    // connection stays in step for the client's next request.
    const int body_status = read_body(req, res, reader, &body);
    const bool method_ok =
        route && (req.method == route->method || (req.method == "HEAD" && std::string(route->method) == "GET"));
    if (!route) {
      send_error(res, ServeError{404, "invalid_request_error", fmt::format("Invalid URL ({} {})", req.method, req.path),
                                 "", "not_found"});
    } else if (!method_ok) {
      res.set_header("Allow", route->method);
      send_error(res, ServeError{405, "invalid_request_error",
                                 fmt::format("method {} is not allowed on {}: use {}", req.method, req.path,
                                             route->method),
                                 "", "method_not_allowed"});
    } else if (route->auth && !opt.api_key.empty() && !authorized(req.get_header_value("Authorization"))) {
      send_error(res, ServeError{401, "invalid_request_error",
                                 req.has_header("Authorization")
                                     ? "Incorrect API key provided"
                                     : "Missing API key: send the header 'Authorization: Bearer <key>'",
                                 "", "invalid_api_key"});
    } else if (body_status == 413) {
      send_error(res, too_large());
      res.set_header("Connection", "close");
    } else if (body_status != 0) {
      send_error(res, server_error(400, "the request body could not be read (cut short or badly chunked)"));
      res.set_header("Connection", "close");
    } else {
      switch (route->route) {
        case Route::chat: generate(Api::chat, req, res, body, arrival); break;
        case Route::completions: generate(Api::completions, req, res, body, arrival); break;
        case Route::tokenize: res.set_content(dump_json(tokenize_response(body, model_context())), kJson); break;
        case Route::detokenize: res.set_content(dump_json(detokenize_response(body, model_context())), kJson); break;
        case Route::models: {
          json model = {{"id", opt.served_model_name},
                        {"object", "model"},
                        {"created", created},
                        {"owned_by", "moe-ep"},
                        {"max_model_len", engine.ready() ? engine.max_model_len() : 0}};
          res.set_content(dump_json({{"object", "list"}, {"data", json::array({model})}}), kJson);
          break;
        }
        case Route::health:
          // Draining counts as unhealthy: load balancers stop sending before the port closes.
          if (draining) send_error(res, server_error(503, "the server is shutting down"));
          else if (engine.failed()) send_error(res, server_error(503, "the engine failed"));
          else if (!engine.ready()) send_error(res, server_error(503, "the model is loading"));
          else res.set_content(R"({"status":"ok"})", kJson);
          break;
        case Route::metrics: res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8"); break;
      }
    }
  } catch (const ServeError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {
    send_error(res, server_error(500, fmt::format("internal server error: {}", e.what())));
  }
  // A stream is counted when it ends (answer_stream's releaser).
  if (!res.content_provider_) metrics.request(label, res.status < 0 ? 200 : res.status);
}

ModelContext HttpServer::Impl::model_context() const {
  if (!engine.ready()) throw server_error(503, "the model is loading: try again shortly");
  ModelContext ctx;
  ctx.name = opt.served_model_name;
  ctx.max_model_len = engine.max_model_len();
  ctx.tokenizer = &engine.tokenizer();
  ctx.chat_template = engine.chat_template();
  ctx.defaults = opt.defaults;
  ctx.parsers = parsers;
  ctx.grammar = opt.grammar;
  return ctx;
}

void HttpServer::Impl::generate(Api api, const httplib::Request& req, httplib::Response& res, const std::string& body,
                                Clock::time_point arrival) {
  if (draining) throw server_error(503, "the server is shutting down");
  if (engine.failed()) throw server_error(503, "the engine failed: no requests can be served");
  if (!engine.ready()) throw server_error(503, "the model is loading: try again shortly");

  ApiRequest r = parse_request(api, body, model_context());  // ServeError: 400 / 404, user input

  auto fl = flights.enter();
  std::unique_ptr<ChoiceGroup> g;
  try {
    g = std::make_unique<ChoiceGroup>(engine, std::move(r.params), r.n);  // ServeError: queue full (503), too long (400)
  } catch (const ServeError&) {
    throw;
  } catch (const std::exception& e) {
    throw server_error(503, fmt::format("the engine could not take the request: {}", e.what()));
  }
  ResponseMeta meta{new_response_id(api), int64_t(std::time(nullptr)), opt.served_model_name};
  if (r.stream) answer_stream(res, std::move(r), std::move(g), std::move(meta), arrival, std::move(fl));
  else answer_whole(req, res, r, *g, std::move(meta), arrival, std::move(fl));
}

ServeError HttpServer::Impl::choice_error(const ChoiceGroup& g) {
  const int i = g.failed();
  if (i >= 0 && g.finish(i) == Finish::error)
    return server_error(503, fmt::format("generation failed: {}", g.stream(i).error()));
  return server_error(503, "the request was cancelled by the server");
}

void HttpServer::Impl::answer_whole(const httplib::Request& req, httplib::Response& res, const ApiRequest& r,
                                    ChoiceGroup& g, ResponseMeta meta, Clock::time_point arrival,
                                    std::unique_ptr<Flight> fl) {
  std::vector<Delta> ds;
  TokenClock clock{arrival, arrival};
  int fd = -1;
  bool looked_for_fd = false;
  for (;;) {
    const size_t before = token_count(ds);
    const bool done = g.read(&ds, kPoll);  // ServeError: a later choice was refused (queue full)
    clock.tokens(token_count(ds) - before, metrics);
    if (done || g.failed() >= 0) break;  // one failed choice fails the request
    if (cancel_all) {
      g.cancel();
      throw server_error(503, "the server is shutting down: the request was cancelled");
    }
    // Short requests finish before this matters; a long one looks for its socket once.
    if (!looked_for_fd && seconds_since(arrival) > 0.5) {
      looked_for_fd = true;
      fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
    }
    if (fd >= 0 && peer_closed(fd)) {
      g.cancel();  // nobody to answer: free the engine's slots now
      metrics.tokens(r.prompt_tokens, g.completion_tokens());
      res.status = 499;  // nginx's "client closed request", for the metrics; the write fails anyway
      res.set_content("client closed request", "text/plain");
      return;
    }
  }
  metrics.tokens(r.prompt_tokens, g.completion_tokens());
  metrics.request_duration.observe(seconds_since(arrival));
  if (g.failed() >= 0) throw choice_error(g);
  std::vector<Output> outs(size_t(g.size()));
  for (int i = 0; i < g.size(); ++i) {
    Output& out = outs[size_t(i)];
    out.text = std::move(ds[size_t(i)].text);
    out.tokens = std::move(ds[size_t(i)].tokens);
    out.finish = g.finish(i);
    out.completion_tokens = g.stream(i).completion_tokens();
    out.cached_tokens = g.stream(i).cached_tokens();
  }
  res.set_content(dump_json(response_json(r, meta, outs, engine.tokenizer())), kJson);
  (void)fl;
}

void HttpServer::Impl::record(StreamState& st, int status) {
  if (st.recorded) return;
  st.recorded = true;
  metrics.tokens(st.req.prompt_tokens, st.group->completion_tokens());
  metrics.request_duration.observe(seconds_since(st.clock.arrival));
  metrics.request(st.req.api == Api::chat ? "/v1/chat/completions" : "/v1/completions", status);
}

void HttpServer::Impl::answer_stream(httplib::Response& res, ApiRequest r, std::unique_ptr<ChoiceGroup> g,
                                     ResponseMeta meta, Clock::time_point arrival, std::unique_ptr<Flight> fl) {
  auto st = std::make_shared<StreamState>(std::move(r), std::move(g), std::move(meta), engine.tokenizer(), arrival,
                                          std::move(fl));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies: do not buffer the events
  // httplib calls the provider until it calls sink.done() or returns false; each call
  // waits at most kPoll for output, so a client that left is seen within ~50 ms.
  auto provider = [this, st](size_t, httplib::DataSink& sink) {
    auto put = [&](const std::string& text) { return text.empty() || sink.write(text.data(), text.size()); };
    auto end_with = [&](const std::string& text) {
      st->ended = true;
      // Count the request before its last event goes out: a client that reads /metrics
      // right after [DONE] must see it.
      record(*st, 200);
      if (put(text)) sink.done();
      return true;
    };
    ChoiceGroup& group = *st->group;
    try {
      if (!st->started) {
        st->started = true;
        if (!put(st->writer.start())) return false;
      }
      if (!sink.is_writable()) return false;  // the client went away (the releaser cancels)
      if (cancel_all) {
        group.cancel();
        return end_with(st->writer.error(server_error(503, "the server is shutting down: the request was cancelled")));
      }
      std::vector<Delta> ds;
      bool done = false;
      try {
        done = group.read(&ds, kPoll);
      } catch (const ServeError& e) {  // a later choice was refused (queue full): the others were cancelled
        return end_with(st->writer.error(e));
      }
      st->clock.tokens(token_count(ds), metrics);
      const bool failed = group.failed() >= 0;
      std::string out;
      for (int i = 0; i < group.size(); ++i) {
        out += st->writer.delta(ds[size_t(i)], i);
        if (!failed && !st->finished[size_t(i)] && group.finish(i) != Finish::none) {
          st->finished[size_t(i)] = true;
          out += st->writer.finish(group.finish(i), i);
        }
      }
      if (failed) {  // the output so far, then the error: the response ends
        group.cancel();
        return end_with(out + st->writer.error(choice_error(group)));
      }
      if (!done) return put(out);
      return end_with(out + st->writer.done(group.completion_tokens(), group.cached_tokens()));
    } catch (const std::exception& e) {
      // Building a chunk failed (a bug): tell the client, end the stream.
      group.cancel();
      return end_with(st->writer.error(server_error(500, fmt::format("internal server error: {}", e.what()))));
    }
  };
  // Runs when the response is destroyed: the stream ended, the client left, or the
  // server stopped. Whatever the engine still runs for it is cancelled.
  auto releaser = [this, st](bool) {
    if (!st->ended) st->group->cancel();
    record(*st, 499);  // no-op when end_with counted it
    st->flight.reset();
  };
  res.set_chunked_content_provider("text/event-stream", provider, releaser);
}

HttpServer::HttpServer(Engine& engine, ServerOptions opt) : impl_(std::make_unique<Impl>(engine, std::move(opt))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  MOE_CHECK(!m.started.exchange(true), "HttpServer::start: already started");
  MOE_CHECK(m.opt.port >= 0 && m.opt.port <= 65535, "--port must be in [0, 65535], got {}", m.opt.port);
  m.parsers = parsers::choose_parsers(m.opt.reasoning_parser, m.opt.tool_call_parser, m.engine.chat_template(),
                                      m.engine.tokenizer());
  m.install();
  m.created = int64_t(std::time(nullptr));
  if (m.opt.port == 0) {
    m.port = m.svr.bind_to_any_port(m.opt.host);
    MOE_CHECK(m.port > 0, "cannot listen on {}: no free port (or the address is not local)", m.opt.host);
  } else {
    MOE_CHECK(m.svr.bind_to_port(m.opt.host, m.opt.port), "cannot listen on {}:{}: the port is in use, or the address "
              "is not one of this machine's", m.opt.host, m.opt.port);
    m.port = m.opt.port;
  }
  // httplib listens with a backlog of 5: a burst of connections (64 clients at once)
  // would overflow it and wait a second per SYN retransmit. listen() again raises it.
  if (m.listen_fd >= 0) ::listen(m.listen_fd, kBacklog);
  m.listener = std::thread([&m] {
    m.svr.listen_after_bind();
    m.listener_done = true;
  });
  // stop() must not run before the accept loop is up: httplib's stop() does nothing then.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!m.svr.is_running() && !m.listener_done && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  MOE_CHECK(m.svr.is_running(), "the HTTP server on {}:{} did not start", m.opt.host, m.port);
}

void HttpServer::stop() {
  Impl& m = *impl_;
  std::lock_guard lk(m.stop_mu);
  if (!m.started || m.stopped) return;
  m.stopped = true;
  m.draining = true;                       // new generation requests: 503
  if (!m.flights.wait_zero(m.opt.drain_timeout)) {
    m.cancel_all = true;                   // the rest: cancelled, streams get an error event
    m.flights.wait_zero(std::chrono::seconds(5));
  }
  m.svr.stop();  // closes the listening socket; the accept loop ends and joins the connection threads
  // Connections waiting on a slow or idle client would each hold that join for up to a
  // read or keep-alive timeout: shut their sockets so it ends now.
  for (int i = 0; i < 200 && m.listener.joinable() && !m.listener_done; ++i) {
    shutdown_connections(m.port);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (m.listener.joinable()) m.listener.join();
}

bool HttpServer::running() const { return impl_->started && !impl_->stopped; }

int HttpServer::port() const { return impl_->port; }

std::string HttpServer::parsers_summary() const { return impl_->parsers.summary; }

std::string HttpServer::metrics_text() const { return impl_->metrics_text(); }

}  // namespace moe::serve
