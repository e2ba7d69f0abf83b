// libFuzzer: arbitrary bytes as the body of POST /v1/chat/completions, /v1/completions,
// /tokenize and /detokenize, through the code the HTTP layer runs (serve/openai.h) with
// the chat_qwen3 fixture's tokenizer and chat template and the parsers `serve` picks for
// it (qwen3 reasoning, Hermes tool calls). The request parser is the part of moe-ep that
// strangers reach. Each call must either throw ServeError with a 4xx status or return a
// request that keeps the promises the engine relies on:
//   - a non-empty prompt of ids inside the vocabulary, prompt + max_tokens <= the context;
//   - sampling fields in their ranges, top_logprobs in [-1, 20], no empty stop string,
//     a cache_salt of at most 256 bytes;
// and the response builders (whole and streamed, with the request's parser options)
// must turn any model text into valid JSON. Anything else (a crash, a sanitizer
// report, another exception, a broken promise) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz_assert.h"
#include "serve/openai.h"
#include "serve/parsers/detect.h"
#include "text/chat_template.h"
#include "serve/grammar/grammar.h"
#include "text/tokenizer.h"

#ifndef MOE_FIXTURES_DIR
#define MOE_FIXTURES_DIR "tests/fixtures"
#endif

namespace {

using moe::serve::Api;
using moe::serve::ServeError;

// Stands in for xgrammar, which the fuzz build does not link: what parse_request asks
// to compile must be a format object (the structured-output shapes are built and
// checked by the same code as in the server). Compiling and running grammars is
// tests/test_serve_grammar.cpp's.
struct CheckingCompiler final : moe::serve::grammar::Compiler {
  struct Nothing final : moe::serve::grammar::Grammar {
    std::unique_ptr<moe::serve::grammar::Matcher> start() const override { return nullptr; }
  };
  std::shared_ptr<const moe::serve::grammar::Grammar> compile(const nlohmann::ordered_json& f) const override {
    FUZZ_ASSERT(f.is_object() && f.contains("type") && f["type"].is_string());
    FUZZ_ASSERT(!f.dump().empty());
    return std::make_shared<Nothing>();
  }
};

struct Served {
  std::unique_ptr<moe::text::Tokenizer> tok;
  std::unique_ptr<moe::text::ChatTemplate> tmpl;
  moe::serve::ModelContext ctx;
};

const Served& served() {
  static const Served s = [] {
    Served r;
    const std::string dir = std::string(MOE_FIXTURES_DIR) + "/chat_qwen3";
    r.tok = moe::text::Tokenizer::from_dir(dir);
    r.tmpl = std::make_unique<moe::text::ChatTemplate>(moe::text::ChatTemplate::from_dir(dir));
    r.ctx.name = "fuzz-model";
    r.ctx.max_model_len = 512;
    r.ctx.tokenizer = r.tok.get();
    r.ctx.chat_template = r.tmpl.get();
    r.ctx.parsers = moe::serve::parsers::choose_parsers("auto", "auto", r.tmpl.get(), *r.tok);
    static const CheckingCompiler grammar;
    r.ctx.grammar = &grammar;
    return r;
  }();
  return s;
}

// Model text with every kind of markup the qwen3/Hermes parsers look for, some broken.
constexpr const char* kReply =
    "<think>plan: call it</think>Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\"}}\n</tool_call><tool_call>{\"name\": broken</tool_call> tail \xe2\x82";

void check_request(const moe::serve::ApiRequest& r, const moe::serve::ModelContext& m) {
  const auto& p = r.params;
  FUZZ_ASSERT(!p.prompt_ids.empty());
  for (int32_t id : p.prompt_ids) FUZZ_ASSERT(id >= 0 && id < m.tokenizer->vocab_size());
  FUZZ_ASSERT(r.prompt_tokens == static_cast<int64_t>(p.prompt_ids.size()));
  FUZZ_ASSERT(p.max_tokens >= 1 && r.prompt_tokens + p.max_tokens <= m.max_model_len);
  FUZZ_ASSERT(p.sampling.temperature >= 0 && p.sampling.temperature <= 2);
  FUZZ_ASSERT(p.sampling.top_p > 0 && p.sampling.top_p <= 1);
  FUZZ_ASSERT(p.sampling.top_k >= 0);
  FUZZ_ASSERT(p.presence_penalty >= -2 && p.presence_penalty <= 2);
  FUZZ_ASSERT(p.frequency_penalty >= -2 && p.frequency_penalty <= 2);
  FUZZ_ASSERT(p.top_logprobs >= -1 && p.top_logprobs <= 20);
  for (const std::string& s : p.stop) FUZZ_ASSERT(!s.empty());
  FUZZ_ASSERT(p.cache_salt.size() <= 256);
  FUZZ_ASSERT(r.n >= 1 && r.n <= moe::serve::kMaxChoices);

  // The responses for a reply with markup, whole and streamed in 5-byte pieces.
  const moe::serve::ResponseMeta meta{"chatcmpl-fuzz", 1, m.name};
  moe::serve::Output out;
  out.text = kReply;
  out.finish = moe::serve::Finish::stop;
  out.completion_tokens = 9;
  const moe::serve::Json whole =
      moe::serve::response_json(r, meta, std::vector<moe::serve::Output>(size_t(r.n), out), *m.tokenizer);
  FUZZ_ASSERT(whole["choices"].size() == size_t(r.n));
  (void)moe::serve::dump_json(whole);
  // The choices' pieces interleaved, as a stream of n choices sends them.
  moe::serve::ChunkWriter w(r, meta, *m.tokenizer);
  std::string sse = w.start();
  const std::string reply = kReply;
  for (size_t i = 0; i < reply.size(); i += 5)
    for (int c = 0; c < r.n; ++c) sse += w.delta(moe::serve::Delta{reply.substr(i, 5), {}}, c);
  for (int c = 0; c < r.n; ++c) sse += w.finish(moe::serve::Finish::length, c);
  sse += w.done(9, 3);
  FUZZ_ASSERT(sse.size() >= 14 && sse.compare(sse.size() - 14, 14, "data: [DONE]\n\n") == 0);
}

template <typename F>
void expect_4xx(F&& f) {
  try {
    f();
  } catch (const ServeError& e) {
    FUZZ_ASSERT(e.status >= 400 && e.status < 500);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Served& s = served();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Api api : {Api::chat, Api::completions})
    expect_4xx([&] { check_request(moe::serve::parse_request(api, body, s.ctx), s.ctx); });
  expect_4xx([&] { (void)moe::serve::dump_json(moe::serve::tokenize_response(body, s.ctx)); });
  expect_4xx([&] { (void)moe::serve::dump_json(moe::serve::detokenize_response(body, s.ctx)); });
  return 0;
}
