#include "serve/grammar/xgrammar_compiler.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include "serve/engine.h"
#include "serve/grammar/structural.h"

namespace moe::serve::grammar {

namespace {

// xgrammar's messages start with "[time] /path/file.cc:line: "; the client needs only
// what follows.
std::string clean_message(const std::string& what) {
  std::string s = what;
  if (auto p = s.find(".cc:"); p != std::string::npos)
    if (auto q = s.find(": ", p + 4); q != std::string::npos) s = s.substr(q + 2);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// xgrammar's bitmask is int32 words with the same bit order as ours (grammar.h).
DLTensor bitmask_tensor(int32_t* data, int64_t* shape) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  return t;
}

class XgMatcher final : public Matcher {
 public:
  XgMatcher(const xgrammar::CompiledGrammar& g, int vocab) : m_(g), words_(xgrammar::GetBitmaskSize(vocab)) {}
  void fill_mask(uint32_t* mask) override {
    int64_t shape[1] = {words_};
    DLTensor t = bitmask_tensor(reinterpret_cast<int32_t*>(mask), shape);
    m_.FillNextTokenBitmask(&t);
  }
  bool accept(int32_t id) override { return m_.AcceptToken(id); }
  bool terminated() const override { return m_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher m_;
  int64_t words_;
};

class XgGrammar final : public Grammar {
 public:
  XgGrammar(xgrammar::CompiledGrammar g, int vocab) : g_(std::move(g)), vocab_(vocab) {}
  std::unique_ptr<Matcher> start() const override { return std::make_unique<XgMatcher>(g_, vocab_); }

 private:
  xgrammar::CompiledGrammar g_;
  int vocab_;
};

}  // namespace

struct XgrammarCompiler::Impl {
  int vocab;
  xgrammar::TokenizerInfo info;
  mutable xgrammar::GrammarCompiler compiler;
  Impl(const GrammarVocab& v, int64_t model_vocab, std::vector<int32_t> stops)
      : vocab(static_cast<int>(model_vocab)),
        info(v.text, xgrammar::VocabType::RAW, static_cast<int>(model_vocab), std::move(stops)),
        compiler(info, static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)), true, kCacheBytes) {}
};

XgrammarCompiler::XgrammarCompiler(const text::Tokenizer& tok, int64_t model_vocab, const std::vector<int64_t>& stop_ids) {
  const GrammarVocab v = grammar_vocab(tok, model_vocab);
  kind_ = v.kind;
  std::vector<int32_t> stops;
  for (int64_t id : stop_ids)
    if (id >= 0 && id < model_vocab && std::find(stops.begin(), stops.end(), id) == stops.end())
      stops.push_back(static_cast<int32_t>(id));
  impl_ = std::make_unique<Impl>(v, model_vocab, std::move(stops));
}

XgrammarCompiler::~XgrammarCompiler() = default;

std::shared_ptr<const Grammar> XgrammarCompiler::compile(const nlohmann::ordered_json& format) const {
  const std::string text = structural_tag(format).dump();
  std::optional<xgrammar::CompiledGrammar> g;
  try {
    g = impl_->compiler.CompileStructuralTag(text);
  } catch (const std::exception& e) {
    throw ServeError(400, "invalid_request_error",
                     fmt::format("the requested output format cannot be compiled to a grammar: {}", clean_message(e.what())));
  }
  auto grammar = std::make_shared<XgGrammar>(std::move(*g), impl_->vocab);
  // A schema whose language is empty (e.g. {"$ref": "#"}, which only refers to itself)
  // compiles, but no token could ever start a reply: refuse it here, not mid-generation.
  auto m = grammar->start();
  std::vector<uint32_t> mask(static_cast<size_t>(mask_words(impl_->vocab)));
  m->fill_mask(mask.data());
  if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }))
    throw ServeError(400, "invalid_request_error", "the requested output format admits no reply: no token can start it");
  return grammar;
}

}  // namespace moe::serve::grammar
