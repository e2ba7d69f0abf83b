// `moe-ep serve`: the OpenAI-compatible server. Rank 0 runs the HTTP threads
// (serve/http_server.h) and the continuous-batching scheduler (serve/engine/
// model_engine.h) on its main thread, which drives MPI; every other rank runs the
// steps rank 0 broadcasts. SIGINT/SIGTERM on rank 0: stop accepting, finish what runs
// (within the HTTP drain timeout, 30 s), tell the other ranks, exit 0 everywhere. A rank that dies or hangs:
// rank 0's next collective fails within --comm-timeout, every open request is answered
// with an error (503 for new ones), and every rank exits non-zero.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/model_opts.h"
#include "cli/parallel_opts.h"
#include "cli/text_opts.h"
#include "cli/verbs.h"
#include "core/check.h"
#include "serve/engine/model_engine.h"
#include "serve/grammar/xgrammar_compiler.h"
#include "serve/http_server.h"

namespace moe {

namespace {

struct ServeOpts {
  CommonOpts common;
  ChatFlags chat;
  serve::ServerOptions http;
  serve::EngineOptions engine;
  double kv_cache_gib = 0;
  int64_t kv_block_size = 16;
  int64_t max_model_len = 0;  // 0: max_position_embeddings
};

// Set by SIGINT/SIGTERM (an atomic store is async-signal-safe); a watcher thread acts on it.
std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop = true; }

// temperature / top_p / top_k of generation_config.json: a request that leaves them out
// gets the model's own defaults, as vLLM does.
serve::SamplingDefaults model_defaults(const std::string& dir) {
  serve::SamplingDefaults d;
  const std::string path = dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  const nlohmann::ordered_json g = read_json_file(path, "generation_config.json");
  if (g.value("do_sample", true) == false) d.temperature = 0;  // greedy by the model's choice
  else if (g.contains("temperature") && g["temperature"].is_number()) d.temperature = g["temperature"].get<double>();
  if (g.contains("top_p") && g["top_p"].is_number()) d.top_p = g["top_p"].get<double>();
  if (g.contains("top_k") && g["top_k"].is_number_integer()) d.top_k = g["top_k"].get<int64_t>();
  return d;
}

int run_serve(ServeOpts& o) {
  Communicator& world = parallel_world(o.common.parallel);
  MOE_CHECK(o.common.parallel.par.dp == 1,
            "serve runs one batch on every rank: --dp must be 1 (DP attention replicas are not served yet)");
  MOE_CHECK(o.engine.max_batch_tokens >= o.engine.max_num_seqs,
            "--max-batch-tokens {} must be at least --max-num-seqs {} (every running request decodes one token per "
            "step)",
            o.engine.max_batch_tokens, o.engine.max_num_seqs);
  MOE_CHECK(o.kv_cache_gib >= 0, "--kv-cache-mem must not be negative, got {}", o.kv_cache_gib);
  const bool lead = world.rank() == 0;
  TextModel tm = load_text_model(o.common.model_dir, o.chat);
  if (lead && !tm.tmpl)
    fmt::print(stderr, "moe-ep serve: warning: {}; /v1/chat/completions will answer 400\n", tm.template_error);
  o.common.max_seq_len = o.max_model_len;
  if (lead) fmt::print(stderr, "moe-ep serve: loading {} on {} rank(s)\n", o.common.model_dir, world.size());
  Loaded L = load(o.common, 0, true,
                  fmt::format("serve {} {} {} {} {}", o.max_model_len, o.engine.max_num_seqs, o.engine.max_batch_tokens,
                              o.kv_cache_gib, o.kv_block_size),
                  {}, [&](ModelOptions& mo) {
                    mo.n_slots = o.engine.max_num_seqs;
                    mo.max_seq = o.max_model_len;  // 0: max_position_embeddings
                    mo.paged_kv = true;
                    mo.kv_block_size = o.kv_block_size;
                    mo.kv_cache_bytes = static_cast<uint64_t>(o.kv_cache_gib * double(uint64_t{1} << 30));
                  });
  Model& m = *L.model;
  if (!lead) {
    // The other ranks follow rank 0's plans; a signal is rank 0's to handle (mpirun
    // forwards SIGINT/SIGTERM to every rank), the stop plan ends this loop.
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
    serve::run_follower(m);
    return 0;
  }
  o.engine.eos_ids = m.config().eos_token_ids;
  for (int64_t id : tokenizer_stop_ids(*tm.tok)) o.engine.eos_ids.push_back(id);
  serve::ModelEngine engine(m, *tm.tok, tm.tmpl.get(), o.engine);
  // Structured outputs: the vocabulary's token texts go to the grammar engine once.
  const serve::grammar::XgrammarCompiler grammar(*tm.tok, m.config().vocab_size, o.engine.eos_ids);
  o.http.grammar = &grammar;
  if (o.http.served_model_name.empty())
    o.http.served_model_name = std::filesystem::path(o.common.model_dir).lexically_normal().filename().string();
  if (o.http.served_model_name.empty())  // "dir/" normalises to an empty filename
    o.http.served_model_name =
        std::filesystem::path(o.common.model_dir).lexically_normal().parent_path().filename().string();
  o.http.defaults = model_defaults(o.common.model_dir);
  serve::HttpServer http(engine, o.http);
  http.start();
  fmt::print(stderr, "moe-ep serve: {}\n", http.parsers_summary());
  // A collective that fails (a rank died or hangs) aborts the job from inside the
  // engine's step: answer every open request first, and give the HTTP threads a
  // moment to send it.
  set_abort_hook([&](const std::string& why) {
    engine.fail_all(why);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  });
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // Shutdown order: the HTTP side stops first (new requests and /health answer 503,
  // in-flight ones may finish within its drain timeout while the engine keeps
  // stepping, the rest are cancelled); then the engine leaves its loop and tells the
  // other ranks to stop.
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!g_stop && !done) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (done) return;
    fmt::print(stderr, "moe-ep serve: stopping (finishing in-flight requests)\n");
    http.stop();
    engine.request_stop();
  });
  const KvCacheShape& ks = m.cache().shape();
  fmt::print(stderr,
             "moe-ep serve: {} ({}) as \"{}\" on http://{}:{} - {} rank(s) ({}), dtype {}, context {} tokens, KV "
             "cache {} blocks of {} ({}, {:.2f} GiB, {} tokens, prefix cache {}), --max-num-seqs {}, --max-batch-tokens {}; loaded in "
             "{:.2f} s\n",
             m.config().model_type, m.config().summary(), o.http.served_model_name, o.http.host, http.port(),
             world.size(), to_string(o.common.parallel.par), weights_desc(o.common), m.cache().max_seq(), ks.n_blocks,
             ks.block_size, dtype_name(ks.dtype), static_cast<double>(ks.bytes()) / double(uint64_t{1} << 30), ks.n_blocks * ks.block_size,
             o.engine.prefix_cache ? "on" : "off", o.engine.max_num_seqs, o.engine.max_batch_tokens, L.load_s);
  std::fflush(stderr);
  try {
    engine.run();
  } catch (...) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the HTTP threads send the errors
    done = true;
    watcher.detach();
    throw;
  }
  done = true;
  watcher.join();
  set_abort_hook({});
  http.stop();
  fmt::print(stderr, "moe-ep serve: stopped\n");
  return 0;
}

}  // namespace

Verb add_serve_verb(CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  CLI::App* s = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server (POST /v1/chat/completions and /v1/completions, streaming or not; GET "
      "/v1/models, /health, /metrics) with continuous batching, on one rank or under mpirun with expert parallelism "
      "(rank 0 serves HTTP and schedules; every rank runs each step)");
  CommonOpts& c = o->common;
  s->add_option("--model", c.model_dir, "Model: a directory (config.json, *.safetensors and the tokenizer files) or a GGUF "
                  "file (qwen3moe, qwen2moe or Mixtral; its tokenizer and chat template from its metadata)")
      ->required()
      ->check(CLI::ExistingPath);
  add_dtype_option(s, c.dtype);
  add_kv_cache_dtype_option(s, c.kv_cache_dtype);
  s->add_option("--quantize", c.quantize,
                "Quantise the routed experts at load: none, w8a8 or w4a8 (see `generate --help`)")
      ->check(CLI::IsMember({"none", "w8a8", "w4a8"}))
      ->capture_default_str();
  s->add_option("--int4-group", c.int4_group, "With --quantize w4a8: input values per weight group (32, 64 or 128)")
      ->check(CLI::IsMember({int64_t{32}, int64_t{64}, int64_t{128}}))
      ->capture_default_str();
  add_weights_cache_option(s, c.weights_cache);
  add_model_parallel_options(s, c.parallel);
  s->add_option("--host", o->http.host, "Address to listen on (127.0.0.1: this machine only)")->capture_default_str();
  s->add_option("--port", o->http.port, "Port to listen on (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  s->add_option("--served-model-name", o->http.served_model_name,
                "The model name requests must give and /v1/models lists (default: the directory's name)");
  s->add_option("--api-key", o->http.api_key, "Require \"Authorization: Bearer KEY\" on /v1/* (401 otherwise)");
  s->add_option("--max-model-len", o->max_model_len,
                "Context length: prompt + generated tokens per request (default: max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  s->add_option("--max-num-seqs", o->engine.max_num_seqs, "Requests in the running batch at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--max-batch-tokens", o->engine.max_batch_tokens,
                "Tokens per step: every running request's decode token, then prompt chunks (long prompts are "
                "prefilled over several steps, between the decode steps of the others)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--max-queue", o->engine.max_queue, "Waiting requests before new ones get 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--kv-cache-mem", o->kv_cache_gib,
                "KV-cache size in GiB, allocated once as blocks shared by all requests (default 0: enough for "
                "--max-num-seqs requests at the full context, at most 4 GiB). Blocks are taken as sequences grow; "
                "when they run out the newest request is preempted and recomputed later (mostly from the prefix "
                "cache); only a prompt larger than the whole cache is refused. The default --kv-cache-dtype bf16 "
                "holds twice the tokens of f32 in the same GiB")
      ->check(CLI::NonNegativeNumber);
  s->add_flag("--no-prefix-cache", [o](int64_t) { o->engine.prefix_cache = false; },
              "Prefill every prompt whole. By default full KV blocks are kept by their tokens' prefix (salted by a "
              "request's cache_salt) and a prompt that starts the same way reads them instead of prefilling them "
              "again, with the same answer bit for bit; unused cached blocks are evicted least recently used first");
  s->add_option("--kv-block-size", o->kv_block_size, "Positions per KV-cache block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  s->add_option("--max-body-bytes", o->http.max_body_bytes, "Largest request body (larger: 413)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--http-threads", o->http.max_threads, "Connections served at once (more wait for a thread)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--reasoning-parser", o->http.reasoning_parser,
                "Split chat replies into message.reasoning_content (the model's <think>...</think>; streamed as "
                "delta.reasoning_content) and content: deepseek_r1 (DeepSeek-R1, V3.1: a reply without <think> "
                "reasons until </think>), qwen3 (Qwen3: reasoning only inside <think>; enable_thinking false in "
                "chat_template_kwargs gives none), none (the reply is all content). auto: qwen3 or deepseek_r1 when "
                "the chat template mentions <think> and the vocabulary has <think> and </think>, else none")
      ->check(CLI::IsMember({"auto", "deepseek_r1", "qwen3", "none"}))
      ->capture_default_str();
  s->add_option("--tool-call-parser", o->http.tool_call_parser,
                "Turn tool-call markup in chat replies into message.tool_calls (finish_reason \"tool_calls\") when "
                "the request has tools: hermes (Qwen2.5/Qwen3 <tool_call>{json}</tool_call>), qwen3_coder "
                "(<tool_call><function=...><parameter=...>), deepseek_v3 (V3, R1: <｜tool▁calls▁begin｜>...```json), "
                "deepseek_v31 (V3.1), mistral ([TOOL_CALLS]), none (markup stays text). auto: from the markup the "
                "chat template writes. Markup that does not parse stays content; tool_choice \"required\" or a "
                "named function is passed on but not enforced (no constrained decoding yet)")
      ->check(CLI::IsMember({"auto", "hermes", "qwen3_coder", "deepseek_v3", "deepseek_v31", "mistral", "none"}))
      ->capture_default_str();
  add_chat_flags(s, o->chat);
  return {s, [o] {
    resolve_auto_dtype(o->common);
    return run_serve(*o);
  }};
}

}  // namespace moe
