// `moe-ep chat`: an interactive multi-turn chat in the terminal. The history goes
// through the model's chat template every turn (no prefix cache: each turn prefills the
// whole conversation). Under mpirun rank 0 reads the terminal and sends each turn's ids
// to the other ranks; while it waits for the user it sends a heartbeat every second,
// so their bounded waits (--comm-timeout) never expire however long the user thinks.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/model_opts.h"
#include "cli/text_opts.h"
#include "cli/verbs.h"
#include "core/check.h"
#include "loader/checkpoint.h"
#include "runtime/generate.h"
#include "text/text_stream.h"

namespace moe {

namespace {

struct ChatOpts {
  CommonOpts common;
  ChatFlags chat;
  std::string system;
  int64_t max_new_tokens = 512;
  double temperature = 0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
};

// Lines from stdin, read on a thread of their own so rank 0 can keep the other ranks
// alive while the user types. nullopt at end of input (Ctrl-D).
class LineReader {
 public:
  LineReader() : t_([this] {
      std::string line;
      while (std::getline(std::cin, line)) push(line);
      push(std::nullopt);
    }) {
    t_.detach();  // blocked in getline at exit; the process ends it
  }
  // Waits up to `timeout`; false when nothing came.
  bool next(std::optional<std::string>* out, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty(); })) return false;
    *out = q_.front();
    q_.pop_front();
    return true;
  }

 private:
  void push(std::optional<std::string> l) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(l));
    }
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::optional<std::string>> q_;
  std::thread t_;
};

// max_position_embeddings of the model's config.json, at most 4096.
int64_t context_positions(const std::string& dir) {
  const nlohmann::json cfg = Checkpoint::open(dir).config();  // config.json, or a GGUF's metadata
  const auto it = cfg.find("max_position_embeddings");
  const int64_t n = it != cfg.end() && it->is_number_integer() ? it->get<int64_t>() : 4096;
  return std::clamp<int64_t>(n, 1, 4096);
}

// Turn protocol from rank 0: n >= 0 ids follow; -1 exit; -2 heartbeat.
constexpr int64_t kExit = -1, kHeartbeat = -2;

int run_chat(const ChatOpts& o) {
  Communicator& world = parallel_world(o.common.parallel);
  MOE_CHECK(o.common.parallel.par.dp == 1, "chat runs one conversation: --dp must be 1");
  const bool lead = world.rank() == 0;
  TextModel tm = load_text_model(o.common.model_dir, o.chat);
  Loaded L = load(o.common, o.max_new_tokens, false,
                  fmt::format("chat {} {} {} {} {}", o.max_new_tokens, o.temperature, o.top_k, o.top_p, o.seed), {},
                  [&](ModelOptions& mo) {
                    mo.n_slots = 1;
                    // A conversation grows: without --max-seq-len it gets the model's context,
                    // capped at 4096 positions because the cache is allocated up front.
                    if (o.common.max_seq_len <= 0)
                      mo.max_seq = context_positions(o.common.model_dir);
                  });
  Model& m = *L.model;
  GenerateOptions go;
  go.max_new_tokens = o.max_new_tokens;
  go.prefill_chunk = kDefaultPrefillChunk;  // a long conversation: bounded activations, a fast first reply
  go.sampling.temperature = o.temperature;
  go.sampling.top_k = o.top_k;
  go.sampling.top_p = o.top_p;
  go.sampling.seed = o.seed;
  go.extra_eos = tokenizer_stop_ids(*tm.tok);
  go.sample_vocab = tm.tok->vocab_size();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  std::unique_ptr<LineReader> reader;
  if (lead) {
    reader = std::make_unique<LineReader>();
    fmt::print(stderr,
               "moe-ep chat: {} ({} rank(s)); type a message, /reset to start over, /exit or Ctrl-D to leave\n",
               m.config().model_type, world.size());
  }
  for (int64_t turn = 0;; ++turn) {
    std::vector<int32_t> ids;
    int64_t n = 0;
    if (lead) {
      fmt::print("> ");
      std::fflush(stdout);
      std::optional<std::string> line;
      while (!reader->next(&line, std::chrono::milliseconds(1000)))
        if (world.size() > 1) {
          int64_t hb = kHeartbeat;
          world.broadcast(&hb, sizeof hb, 0);
        }
      if (!line || *line == "/exit" || *line == "/quit") {
        n = kExit;
      } else if (*line == "/reset") {
        messages = nlohmann::ordered_json::array();
        if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
        fmt::print("(conversation cleared)\n");
        continue;
      } else if (line->empty()) {
        continue;
      } else {
        messages.push_back({{"role", "user"}, {"content", *line}});
        ids = encode_rendered_chat(*tm.tok, render_chat(tm, o.chat, messages, true));
        n = static_cast<int64_t>(ids.size());
      }
    }
    if (world.size() > 1) {
      do {
        world.broadcast(&n, sizeof n, 0);
      } while (n == kHeartbeat);
      if (n > 0) {
        ids.resize(n);
        world.broadcast(ids.data(), n * sizeof(int32_t), 0);
      }
    }
    if (n == kExit) break;
    text::TextStream out(*tm.tok, {}, {true});
    go.on_token = [&](int64_t, int32_t tok) {
      const text::TextStream::Piece p = out.push(tok);
      if (lead) {
        std::fwrite(p.text.data(), 1, p.text.size(), stdout);
        std::fflush(stdout);
      }
      return false;
    };
    try {
      generate(m, {ids}, go);
    } catch (const Error& e) {  // the same on every rank (checked before any collective)
      if (lead) fmt::print(stderr, "\nmoe-ep chat: {}\n(use /reset to start a new conversation)\n", e.what());
      if (lead) messages.erase(messages.end() - 1);
      continue;
    }
    const text::TextStream::Piece tail = out.finish();
    if (lead) {
      fmt::print("{}\n", tail.text);
      messages.push_back({{"role", "assistant"}, {"content", out.text()}});
    }
  }
  return 0;
}

}  // namespace

Verb add_chat_verb(CLI::App& app) {
  auto o = std::make_shared<ChatOpts>();
  CLI::App* c = app.add_subcommand(
      "chat",
      "Chat with a model in the terminal: each line you type is a user message; the conversation goes through the "
      "model's chat template and the reply streams back. /reset clears the history, /exit or Ctrl-D leaves. Runs "
      "under mpirun with the parallel flags too (rank 0 reads the terminal)");
  add_common(c, o->common);
  c->add_option("--system", o->system, "A system message to start every conversation with");
  c->add_option("--max-new-tokens", o->max_new_tokens, "Longest reply, in tokens (fewer at the end-of-turn token)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--temperature", o->temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--top-k", o->top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--top-p", o->top_p, "Nucleus sampling threshold in (0, 1]")->capture_default_str();
  c->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  add_chat_flags(c, o->chat);
  return {c, [o] {
    resolve_auto_dtype(o->common);
    return run_chat(*o);
  }};
}

}  // namespace moe
