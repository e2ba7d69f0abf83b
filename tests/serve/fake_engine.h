// A scripted Engine and a byte-level Tokenizer for the HTTP / OpenAI tests: no model,
// deterministic output (the prompt's ids again, cyclically), a token every 1-5 ms.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "serve/engine.h"
#include "serve/openai.h"
#include "text/chat_template.h"
#include "text/text_stream.h"
#include "text/tokenizer.h"

namespace moe::serve::testing {

// ids 0..4: <unk> <s> </s> <|im_start|> <|im_end|> (special); 5 + b: the byte b.
class FakeTokenizer : public text::Tokenizer {
 public:
  static constexpr int32_t kByte0 = 5;
  FakeTokenizer() {
    special_.unk = "<unk>", special_.bos = "<s>", special_.eos = "</s>";
    special_.unk_id = 0, special_.bos_id = 1, special_.eos_id = 2;
  }
  std::vector<int32_t> encode(std::string_view text, const text::EncodeOptions& opt = {}) const override {
    check_utf8(text);
    std::vector<int32_t> ids;
    if (opt.add_special_tokens) ids.push_back(1);
    for (size_t i = 0; i < text.size();) {
      int32_t sp = -1;
      if (opt.parse_special)
        for (int32_t id = 0; id < kByte0; ++id)
          if (text.substr(i).starts_with(kSpecial[id])) sp = id;
      if (sp >= 0) {
        ids.push_back(sp);
        i += std::string_view(kSpecial[sp]).size();
      } else {
        ids.push_back(kByte0 + (unsigned char)text[i++]);
      }
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, const text::DecodeOptions& opt = {}) const override {
    std::string bytes;
    for (int32_t id : ids) {
      MOE_CHECK(id >= 0 && id < vocab_size(), "token id {} out of range", id);
      if (id < kByte0) {
        if (!opt.skip_special_tokens) bytes += kSpecial[id];
      } else {
        bytes += char(id - kByte0);
      }
    }
    return valid_utf8(bytes);
  }
  int64_t vocab_size() const override { return kByte0 + 256; }
  std::optional<int32_t> token_to_id(std::string_view t) const override {
    for (int32_t id = 0; id < kByte0; ++id)
      if (t == kSpecial[id]) return id;
    if (t.size() == 1) return kByte0 + (unsigned char)t[0];
    return std::nullopt;
  }
  std::string id_to_token(int32_t id) const override { return decode({id}); }
  bool is_special(int32_t id) const override { return id < kByte0; }
  const text::SpecialTokens& special_tokens() const override { return special_; }

  std::vector<int32_t> ids(std::string_view s) const { return encode(s, {false, false}); }

 private:
  static constexpr const char* kSpecial[kByte0] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
  // Length of the UTF-8 character at s[i], or 0 when it is not a whole valid one.
  static size_t char_len(std::string_view s, size_t i) {
    const unsigned char c = s[i];
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return 0;
    return n;
  }
  static void check_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
      const size_t n = char_len(s, i);
      MOE_CHECK(n > 0, "invalid UTF-8 at byte {}", i);
      i += n;
    }
  }
  static std::string valid_utf8(const std::string& s) {  // bad bytes -> U+FFFD, as `tokenizers`
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const size_t n = char_len(s, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";
        ++i;
      } else {
        out.append(s, i, n);
        i += n;
      }
    }
    return out;
  }
  text::SpecialTokens special_;
};

// ChatML, the template most chat models use; rendered by the real Jinja engine.
inline const char* kChatMl =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}";

// A ModelContext over FakeTokenizer and ChatML: what the request parser reads (the tests
// of openai.cpp and of the reply parsers' request options). Not copyable: m points at
// the members.
// Records the formats parse_request asks to compile (structured outputs). Its grammars
// are never run (the fake engine does not sample); the real compiler is tested in
// tests/test_serve_grammar.cpp.
class RecordingCompiler : public grammar::Compiler {
 public:
  std::shared_ptr<const grammar::Grammar> compile(const nlohmann::ordered_json& format) const override {
    std::lock_guard lk(mu_);
    formats_.push_back(format);
    return std::make_shared<AnyGrammar>();
  }
  std::vector<nlohmann::ordered_json> formats() const {
    std::lock_guard lk(mu_);
    return formats_;
  }

 private:
  struct AnyMatcher : grammar::Matcher {
    void fill_mask(uint32_t*) override {}
    bool accept(int32_t) override { return true; }
    bool terminated() const override { return false; }
  };
  struct AnyGrammar : grammar::Grammar {
    std::unique_ptr<grammar::Matcher> start() const override { return std::make_unique<AnyMatcher>(); }
  };
  mutable std::mutex mu_;
  mutable std::vector<nlohmann::ordered_json> formats_;
};

struct FakeModelContext {
  FakeTokenizer tok;
  text::ChatTemplate tmpl{kChatMl, "chatml"};
  RecordingCompiler grammar;
  ModelContext m;
  explicit FakeModelContext(int64_t max_model_len) {
    m.name = "fake-model";
    m.max_model_len = max_model_len;
    m.tokenizer = &tok;
    m.chat_template = &tmpl;
    m.grammar = &grammar;
  }
  FakeModelContext(const FakeModelContext&) = delete;
  FakeModelContext& operator=(const FakeModelContext&) = delete;
};

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(int64_t max_model_len = 512) : max_model_len_(max_model_len) {
    tmpl_ = std::make_unique<text::ChatTemplate>(kChatMl, "chatml");
  }
  ~FakeEngine() override {
    std::vector<std::thread> ts;
    {
      std::lock_guard lk(mu_);
      ts.swap(threads_);
    }
    for (auto& t : ts) t.join();
  }

  std::shared_ptr<Stream> submit(RequestParams p) override {
    std::lock_guard lk(mu_);
    if (active_ >= max_active) throw ServeError{503, "server_error", "the request queue is full", "", ""};
    ++active_;
    ++submitted;
    last = p;
    submits.push_back({p.sampling.seed, emitted.load()});
    auto s = std::make_shared<Stream>();
    threads_.emplace_back([this, s, p = std::move(p)] { run(*s, p); });
    return s;
  }
  bool ready() const override { return ready_flag; }
  bool failed() const override { return failed_flag; }
  int64_t max_model_len() const override { return max_model_len_; }
  const text::Tokenizer& tokenizer() const override { return tok_; }
  const text::ChatTemplate* chat_template() const override { return with_template ? tmpl_.get() : nullptr; }
  std::string metrics() const override {
    return "# HELP fake_engine_requests_running Requests running.\n# TYPE fake_engine_requests_running gauge\n"
           "fake_engine_requests_running " + std::to_string(active()) + "\n";
  }

  int64_t active() const {
    std::lock_guard lk(mu_);
    return active_;
  }
  RequestParams last_params() const {
    std::lock_guard lk(mu_);
    return last;
  }
  struct Submit {
    uint64_t seed;
    int64_t emitted_before;  // tokens every stream had produced when this request came
  };
  std::vector<Submit> submit_log() const {
    std::lock_guard lk(mu_);
    return submits;
  }
  // Waits (bounded) until no request runs.
  bool wait_idle(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (active() > 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return active() == 0;
  }

  std::atomic<bool> ready_flag{true}, failed_flag{false}, with_template{true};
  std::atomic<int64_t> max_active{1 << 20};
  std::atomic<int> fail_after{-1};       // >= 0: the stream fails after this many tokens
  std::atomic<int> slow_ms{0};           // > 0: every token takes this long (instead of 1-5 ms)
  std::atomic<int64_t> cancelled{0}, completed{0}, submitted{0}, emitted{0};
  // true: token i is the prompt's id (i + seed) mod its length, so requests with different
  // seeds (the choices of one request) answer differently; false: from id 0 (i mod length).
  std::atomic<bool> rotate_by_seed{false};

 private:
  void run(Stream& s, const RequestParams& p) {
    text::DecodeOptions dopt;
    dopt.skip_special_tokens = p.skip_special_tokens;
    text::TextStream ts(tok_, p.stop, dopt);
    Finish f = Finish::length;
    for (int64_t i = 0; i < p.max_tokens; ++i) {
      if (s.cancelled()) {
        f = Finish::cancelled;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms > 0 ? slow_ms.load() : 1 + i % 5));
      if (fail_after >= 0 && i >= fail_after) {
        f = Finish::error;
        break;
      }
      const uint64_t shift = rotate_by_seed ? p.sampling.seed % p.prompt_ids.size() : 0;
      const int32_t id = p.prompt_ids[(size_t(i) + shift) % p.prompt_ids.size()];
      if (!p.ignore_eos && id == tok_.special_tokens().eos_id) {
        f = Finish::stop;
        break;
      }
      TokenLogprob lp{id, -0.5f, {}};
      for (int k = 0; k < p.top_logprobs; ++k) lp.top.push_back({int32_t(FakeTokenizer::kByte0 + 'a' + k), -1.0f - k});
      auto piece = ts.push(id);
      ++emitted;  // before the append: a reader that sees the token sees the count
      s.append(piece.text, lp);
      if (piece.stopped) {
        f = Finish::stop;
        break;
      }
    }
    if (f == Finish::length || f == Finish::stop) s.append_text(ts.finish().text);
    if (f == Finish::cancelled) ++cancelled;
    else ++completed;
    {
      // Before the finish: a client that has its answer must see the engine idle
      // (HttpServer.MetricsParseAndCount reads the gauge right after the last request).
      std::lock_guard lk(mu_);
      --active_;
    }
    s.finish(f, f == Finish::error ? "rank 1 stopped answering" : "");
  }

  int64_t max_model_len_;
  FakeTokenizer tok_;
  std::unique_ptr<text::ChatTemplate> tmpl_;
  mutable std::mutex mu_;
  std::vector<std::thread> threads_;
  int64_t active_ = 0;
  RequestParams last;
  std::vector<Submit> submits;
};

}  // namespace moe::serve::testing
