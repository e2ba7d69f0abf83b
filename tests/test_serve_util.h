// What the serving-scheduler tests share: a model served by a ModelEngine on a thread,
// a tokenizer that prints ids, and helpers to run a request to its end.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "serve/engine/model_engine.h"
#include "test_model_util.h"

namespace moe::test {

using namespace std::chrono_literals;

// Decodes id i as "[i]": enough to check what the engine does with text (stop strings,
// assembly) without a real vocabulary.
// vocab: ids at or past it are out of range (decode throws, as a real tokenizer's does).
class IdTokenizer final : public text::Tokenizer {
 public:
  explicit IdTokenizer(int64_t vocab = 1 << 20) : vocab_(vocab) {}
  std::vector<int32_t> encode(std::string_view, const text::EncodeOptions&) const override { return {}; }
  std::string decode(const std::vector<int32_t>& ids, const text::DecodeOptions&) const override {
    std::string s;
    for (int32_t i : ids) {
      MOE_CHECK(i >= 0 && i < vocab_, "decode: token id {} is out of range [0, {})", i, vocab_);
      s += fmt::format("[{}]", i);
    }
    return s;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(int32_t id) const override { return fmt::format("[{}]", id); }
  bool is_special(int32_t) const override { return false; }
  const text::SpecialTokens& special_tokens() const override { return sp_; }

 private:
  int64_t vocab_;
  text::SpecialTokens sp_;
};

struct Served {
  std::unique_ptr<Model> model;
  IdTokenizer tok;
  std::unique_ptr<serve::ModelEngine> engine;
  std::thread loop;
  Served(const std::string& dir, serve::EngineOptions eo, int64_t kv_blocks, int64_t block_size = 4,
         DType kv_dtype = DType::F32, int64_t max_seq = 48) {
    ModelOptions o;
    o.kv_cache_dtype = kv_dtype;
    o.n_slots = eo.max_num_seqs;
    o.max_seq = max_seq;
    o.paged_kv = true;
    o.kv_block_size = block_size;
    o.count_experts = true;
    model = Model::load(dir, o);
    // The pool is sized by bytes; ask for exactly kv_blocks blocks.
    const KvCacheShape& ks = model->cache().shape();
    if (kv_blocks > 0) {
      o.kv_cache_bytes = KvCacheShape::bytes_per_block(ks.n_layers, ks.block_size, ks.a_dim, ks.b_dim, ks.dtype) * kv_blocks;
      model = Model::load(dir, o);
    }
    engine = std::make_unique<serve::ModelEngine>(*model, tok, nullptr, eo);
  }
  void start() {
    loop = std::thread([this] { engine->run(); });
  }
  ~Served() {
    engine->request_stop();
    if (loop.joinable()) loop.join();
  }
};

struct Result {
  std::vector<int32_t> ids;
  std::vector<serve::TokenLogprob> tokens;  // with logprobs when the request asked
  std::string text;
  serve::Finish finish = serve::Finish::none;
  int64_t cached = 0;  // prompt tokens the prefix cache served
};

inline Result drain(serve::Stream& s) {
  Result r;
  serve::Delta d;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (r.finish == serve::Finish::none && std::chrono::steady_clock::now() < deadline) r.finish = s.read(&d, 50ms);
  s.read(&d, 0ms);
  for (const auto& t : d.tokens) r.ids.push_back(t.id);
  r.tokens = d.tokens;
  r.text = d.text;
  r.cached = s.cached_tokens();
  return r;
}

inline serve::RequestParams greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  serve::RequestParams p;
  p.prompt_ids = prompt;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;  // the goldens ran with EOS disabled
  return p;
}

inline std::vector<int32_t> prefix(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + std::min(n, v.size())}; }

inline ModelFixture qwen3() {
  for (auto& f : model_fixtures())
    if (f.name == "qwen3_moe") return f;
  ADD_FAILURE() << "fixture qwen3_moe missing";
  return {};
}

}  // namespace moe::test
