#include "serve/engine/model_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "runtime/sampler.h"
#include "serve/engine/step_plan.h"
#include "text/text_stream.h"

namespace moe::serve {

using Clock = std::chrono::steady_clock;

struct Request {
  int64_t id = 0;
  RequestParams p;
  std::shared_ptr<Stream> out;
  int32_t slot = -1;
  std::vector<int32_t> blocks;  // KV blocks of positions [0, blocks.size() * block_size)
  std::vector<int32_t> tokens;  // prompt, then generated
  // n_cached: positions whose K/V are in `blocks` (the next token to run is
  // tokens[n_cached]; tokens.size() - n_cached >= 1 while running).
  int64_t n_prompt = 0, n_cached = 0;
  std::vector<uint64_t> keys;  // prefix-cache key of each full block of `tokens` (BlockPool::chain_key)
  int64_t n_published = 0;     // blocks[0, n_published) are in the prefix cache (or matched from it)
  uint64_t serial = 0;         // BlockPool's name of the prefix up to block n_published
  int64_t admitted = -1;       // admission order: the largest is preempted first
  bool queried = false;        // counted in the prefix-cache metrics (first admission only)
  std::unique_ptr<text::TextStream> text;
  std::unordered_map<int32_t, int32_t> counts;  // generated token -> times (penalties)
  // Structured outputs: where the reply is in its grammar (null: free), and the tokens
  // the grammar allows next ([grammar::mask_words(V)] bits), filled while the step runs.
  std::unique_ptr<grammar::Matcher> matcher;
  std::vector<uint32_t> mask;
  Finish done = Finish::none;                   // set by sampling; retired before the next step
  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
};

namespace {

int64_t blocks_for(int64_t positions, int64_t block_size) { return (positions + block_size - 1) / block_size; }

// The keys of every full block of r.tokens not keyed yet.
void update_keys(Request& r, int64_t bs) {
  while (static_cast<int64_t>(r.keys.size() + 1) * bs <= static_cast<int64_t>(r.tokens.size())) {
    const uint64_t parent = r.keys.empty() ? BlockPool::root_key(r.p.cache_salt) : r.keys.back();
    r.keys.push_back(BlockPool::chain_key(parent, r.tokens.data() + r.keys.size() * bs, bs));
  }
}

// log-softmax of one row, in double for the sum (logprobs are reported, not sampled).
void log_softmax(const float* x, int64_t V, std::vector<float>& out) {
  out.resize(V);
  const float mx = *std::max_element(x, x + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < V; ++i) out[i] = static_cast<float>(x[i] - lse);
}

}  // namespace

ModelEngine::ModelEngine(Model& model, const text::Tokenizer& tok, const text::ChatTemplate* tmpl, EngineOptions opt)
    : model_(model),
      tok_(tok),
      tmpl_(tmpl),
      opt_(std::move(opt)),
      pool_(std::max<int64_t>(1, model.cache().shape().n_blocks), model.cache().block_size(), opt_.prefix_cache) {
  const KvCache& c = model_.cache();
  sample_vocab_ = std::min(model_.config().vocab_size, tok_.vocab_size());
  MOE_CHECK(c.shape().paged(), "internal: the served model needs a paged KV cache");
  MOE_CHECK(opt_.max_num_seqs >= 1 && opt_.max_num_seqs <= c.n_slots(),
            "--max-num-seqs {} must be in [1, {}] (the KV cache's sequence slots)", opt_.max_num_seqs, c.n_slots());
  MOE_CHECK(opt_.max_batch_tokens >= opt_.max_num_seqs,
            "--max-batch-tokens {} must be at least --max-num-seqs {} (every running request decodes one token per "
            "step)",
            opt_.max_batch_tokens, opt_.max_num_seqs);
  for (int64_t s = opt_.max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
}

ModelEngine::~ModelEngine() = default;

std::shared_ptr<Stream> ModelEngine::submit(RequestParams p) {
  if (failed_) throw ServeError{503, "server_error", "the engine has failed; see the server's log", ""};
  if (stop_requested_) throw ServeError{503, "server_error", "the server is shutting down", ""};
  const int64_t V = model_.config().vocab_size, n = static_cast<int64_t>(p.prompt_ids.size());
  if (n == 0) throw ServeError{400, "invalid_request_error", "the prompt is empty (no tokens)", "prompt"};
  for (int32_t id : p.prompt_ids)
    if (id < 0 || id >= V)
      throw ServeError{400, "invalid_request_error",
                       fmt::format("token id {} is out of the model's vocabulary (0..{})", id, V - 1), "prompt"};
  if (p.max_tokens < 1)
    throw ServeError{400, "invalid_request_error", fmt::format("max_tokens must be at least 1, got {}", p.max_tokens),
                     "max_tokens"};
  const int64_t ctx = max_model_len();
  if (n + p.max_tokens > ctx)
    throw ServeError{400, "invalid_request_error",
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                 "({} in the prompt, {} for the completion). Please reduce the prompt or max_tokens.",
                                 ctx, n + p.max_tokens, n, p.max_tokens),
                     "max_tokens"};
  // Blocks are taken as the sequence grows (a long generation preempts others, and ends
  // with "length" only if it outgrows the whole pool alone), so only the prompt must fit.
  const KvCache& c = model_.cache();
  if (blocks_for(n, c.block_size()) > c.shape().n_blocks)
    throw ServeError{400, "invalid_request_error",
                     fmt::format("the prompt has {} tokens but the KV cache holds {} positions in all (--kv-cache-mem)",
                                 n, c.shape().n_blocks * c.block_size()),
                     "messages"};
  auto r = std::make_unique<Request>();
  r->out = std::make_shared<Stream>();
  r->out->set_prompt_tokens(n);
  r->tokens = p.prompt_ids;
  r->n_prompt = n;
  text::DecodeOptions dopt;
  dopt.skip_special_tokens = p.skip_special_tokens;
  r->text = std::make_unique<text::TextStream>(tok_, p.stop, dopt);
  if (p.grammar) r->matcher = p.grammar->start();
  r->p = std::move(p);
  std::shared_ptr<Stream> out = r->out;
  {
    std::lock_guard lk(mu_);
    if (static_cast<int64_t>(incoming_.size()) + n_waiting_shared_ >= opt_.max_queue)
      throw ServeError{503, "server_error", fmt::format("the queue is full ({} waiting, --max-queue)", opt_.max_queue),
                       ""};
    r->id = next_id_++;
    incoming_.push_back(std::move(r));
  }
  cv_.notify_all();
  return out;
}

void ModelEngine::retire(Request& r, Finish f) {
  if (f != Finish::cancelled) {
    const text::TextStream::Piece tail = r.text->finish();
    r.out->append_text(tail.text);
  }
  r.out->finish(f);
  release_blocks(r);
  r.blocks.clear();
  if (r.slot >= 0) free_slots_.push_back(r.slot);
  r.slot = -1;
}

bool ModelEngine::grow(Request& r, int64_t upto) {
  const int64_t need = blocks_for(upto, model_.cache().block_size()) - static_cast<int64_t>(r.blocks.size());
  if (need > pool_.available()) return false;
  for (int64_t i = 0; i < need; ++i) r.blocks.push_back(pool_.take());
  return true;
}

void ModelEngine::release_blocks(Request& r) {
  // Last block first: the cache evicts the least recently released first, so a prefix
  // loses its tail before its head, and what stays cached is still a usable prefix.
  for (auto it = r.blocks.rbegin(); it != r.blocks.rend(); ++it) pool_.release(*it);
  r.blocks.clear();
}

void ModelEngine::preempt(Request& r) {
  release_blocks(r);  // its published blocks stay cached
  r.n_cached = r.n_published = 0;
  r.serial = 0;
  free_slots_.push_back(r.slot);
  r.slot = -1;
  {
    std::lock_guard lk(mu_);  // metrics() reads it
    ++preemptions_;
  }
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == &r; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

bool ModelEngine::admit_head(int64_t budget) {
  if (waiting_.empty() || budget <= 0 || free_slots_.empty() ||
      static_cast<int64_t>(running_.size()) >= opt_.max_num_seqs)
    return false;
  Request& r = *waiting_.front();
  const int64_t bs = model_.cache().block_size(), len = static_cast<int64_t>(r.tokens.size());
  update_keys(r, bs);
  // The last token always runs (its logits sample the next one), so at most the full
  // blocks before it come from the cache.
  r.blocks = pool_.match(r.keys, r.tokens, r.p.cache_salt, (len - 1) / bs, &r.serial);
  r.n_published = static_cast<int64_t>(r.blocks.size());
  r.n_cached = r.n_published * bs;
  // The first chunk must get its blocks now; otherwise the head waits (FIFO).
  if (!grow(r, r.n_cached + std::min(len - r.n_cached, budget))) {
    release_blocks(r);
    r.n_cached = r.n_published = 0;
    r.serial = 0;
    return false;
  }
  if (!r.queried) {  // a recomputation after a preemption is not a new query
    r.queried = true;
    r.out->set_cached_tokens(r.n_cached);
    std::lock_guard lk(mu_);
    prefix_queries_ += r.n_prompt;
    prefix_hits_ += r.n_cached;
  }
  r.slot = free_slots_.back();
  free_slots_.pop_back();
  r.admitted = next_admission_++;
  running_.push_back(std::move(waiting_.front()));
  waiting_.pop_front();
  return true;
}

void ModelEngine::publish_blocks(Request& r) {
  const int64_t bs = model_.cache().block_size();
  update_keys(r, bs);
  for (int64_t j = r.n_published; (j + 1) * bs <= r.n_cached; ++j, ++r.n_published)
    r.serial = pool_.publish(r.blocks[j], r.keys[j], r.tokens.data() + j * bs, r.serial, r.p.cache_salt);
}

void ModelEngine::update_shared() {
  std::lock_guard lk(mu_);
  n_waiting_shared_ = static_cast<int64_t>(waiting_.size());
  n_running_shared_ = static_cast<int64_t>(running_.size());
  kv_used_shared_ = pool_.n_held();
  kv_cached_shared_ = pool_.n_cached();
}

void ModelEngine::sample_rows(const std::vector<Request*>& rows, const Tensor& logits) {
  const int64_t V = model_.config().vocab_size;
  // Rows are V wide, but only ids the tokenizer has are drawn (see sample_vocab_).
  const int64_t Vs = sample_vocab_;
  std::vector<float> row, lp, masked;
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    const float* lg = logits.data<float>() + static_cast<int64_t>(i) * V;
    const bool penalised = (r.p.presence_penalty != 0 || r.p.frequency_penalty != 0) && !r.counts.empty();
    if (penalised) {  // OpenAI: logit -= count * frequency + (count > 0) * presence, generated tokens only
      row.assign(lg, lg + V);
      for (auto [id, n] : r.counts) row[id] -= static_cast<float>(n * r.p.frequency_penalty + r.p.presence_penalty);
      lg = row.data();
    }
    // Logprobs are the model's (after penalties, before the grammar's mask), as vLLM
    // reports them; the draw sees only the tokens the grammar allows.
    const float* drawn = lg;
    if (r.matcher) {
      masked.assign(lg, lg + Vs);
      bool any = false;
      for (int64_t id = 0; id < Vs; ++id) {
        const bool ok = grammar::mask_allows(r.mask.data(), static_cast<int32_t>(id));
        any = any || ok;
        if (!ok) masked[id] = -std::numeric_limits<float>::infinity();
      }
      if (!any) {  // cannot happen for a grammar that compiled (openai.cpp refuses empty ones)
        r.done = Finish::error;
        r.out->finish(Finish::error, "the output grammar allows no next token");
        continue;
      }
      drawn = masked.data();
    }
    // The draw depends on (seed, step) only: the same seed gives the same text alone or
    // in any batch.
    const int32_t tok = sample_token(drawn, Vs, r.p.sampling, 0, static_cast<uint64_t>(r.n_generated()));
    const bool grammar_done = r.matcher && r.matcher->accept(tok) && r.matcher->terminated();
    TokenLogprob tl;
    tl.id = tok;
    if (r.p.top_logprobs >= 0) {
      log_softmax(lg, Vs, lp);
      tl.logprob = lp[tok];
      std::vector<int32_t> order(Vs);
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = std::min<int64_t>(r.p.top_logprobs, Vs);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
      for (int64_t j = 0; j < k; ++j) tl.top.emplace_back(order[j], lp[order[j]]);
    }
    r.tokens.push_back(tok);
    ++r.counts[tok];
    // A grammar ends on a stop token (the only tokens a complete grammar allows), even
    // under ignore_eos: nothing could follow it.
    const bool eos = grammar_done ||
                     (!r.p.ignore_eos && std::find(opt_.eos_ids.begin(), opt_.eos_ids.end(), tok) != opt_.eos_ids.end());
    // The EOS token counts as generated (usage) but its text is not returned (as vLLM).
    const text::TextStream::Piece piece = eos ? text::TextStream::Piece{} : r.text->push(tok);
    r.out->append(piece.text, tl);
    if (piece.stopped || eos) r.done = Finish::stop;
    else if (r.n_generated() >= r.p.max_tokens) r.done = Finish::length;
  }
}

bool ModelEngine::step() {
  const int64_t bs = model_.cache().block_size();
  StepPlan plan;
  plan.kind = PlanKind::step;
  StepBatch& b = plan.batch;
  std::vector<Request*> in_step, logit_req;
  int64_t budget = opt_.max_batch_tokens;
  // n tokens of r from tokens[n_cached]; the chunk that reaches the last known token
  // samples the next one (a decode, the end of a prompt, the end of a recomputation).
  auto add = [&](Request& r, int64_t n) {
    SeqSpan sp;
    sp.slot = r.slot;
    sp.first = b.n_tokens();
    sp.n = n;
    sp.start_pos = r.n_cached;
    for (int64_t p = r.n_cached; p < r.n_cached + n; ++p) {
      b.tokens.push_back(r.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
    }
    if (r.n_cached + n == static_cast<int64_t>(r.tokens.size())) {
      b.logit_rows.push_back(b.n_tokens() - 1);
      // What sample_rows reads of the row: penalties, logprobs and a grammar's mask read
      // all of it.
      const bool whole =
          r.p.presence_penalty != 0 || r.p.frequency_penalty != 0 || r.p.top_logprobs >= 0 || r.matcher != nullptr;
      // Draws stay below sample_vocab_: the padding past it may hold some of the k best.
      b.logit_top_k.push_back(whole ? 0 : gathered_top_k(r.p.sampling, model_.config().vocab_size - sample_vocab_));
      logit_req.push_back(&r);
    }
    b.seqs.push_back(sp);
    plan.blocks.push_back(r.blocks);
    in_step.push_back(&r);
    budget -= n;
  };
  auto decoding = [](const Request& r) {
    return r.n_cached >= r.n_prompt && static_cast<int64_t>(r.tokens.size()) - r.n_cached == 1;
  };
  const int64_t preempted_before = preemptions_;
  // 1. Decodes, oldest first (max_batch_tokens >= max_num_seqs: they always fit). One
  //    that needs a block when the pool has none preempts the newest request, itself
  //    if it is the newest; alone, it has outgrown the whole pool and ends ("length").
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    if (!decoding(r)) continue;
    bool runs = true;
    while (runs && !grow(r, r.n_cached + 1)) {
      if (running_.size() == 1) {
        r.done = Finish::length;
        runs = false;
      } else {
        Request& victim = *running_.back();
        runs = &victim != &r;
        preempt(victim);
      }
    }
    if (runs) add(r, 1);
  }
  // 2. Prompt chunks of the running requests still in prefill, oldest first, as far as
  //    the budget and the pool allow.
  for (auto& rp : running_) {
    Request& r = *rp;
    if (decoding(r) || budget <= 0) continue;
    const int64_t room = (static_cast<int64_t>(r.blocks.size()) + pool_.available()) * bs - r.n_cached;
    const int64_t n = std::min({static_cast<int64_t>(r.tokens.size()) - r.n_cached, budget, room});
    if (n <= 0) continue;
    grow(r, r.n_cached + n);
    add(r, n);
  }
  // 3. New requests (not in a step that had to preempt: the blocks it freed are for
  //    the running ones), their first chunk after what the prefix cache holds.
  if (preemptions_ == preempted_before)
    while (admit_head(budget)) {
      Request& r = *running_.back();
      add(r, std::min(static_cast<int64_t>(r.tokens.size()) - r.n_cached, budget));
    }
  if (b.n_tokens() == 0) {
    // Requests in prefill hold all the blocks and none can go on: the newest gives its
    // blocks back so the older ones can (alone, one always can: its prompt fits the pool).
    if (running_.size() == 1 && running_.front()->done == Finish::none) running_.front()->done = Finish::length;
    else if (running_.size() > 1) preempt(*running_.back());
    return false;
  }
  Communicator* w = model_.world();
  if (w && w->size() > 1) broadcast_plan(*w, plan);
  for (size_t i = 0; i < b.seqs.size(); ++i) model_.cache().set_blocks(b.seqs[i].slot, plan.blocks[i]);
  // The grammar masks of the rows this step samples are filled on a helper thread while
  // the forward runs: they depend only on the tokens so far, not on these logits.
  const Tensor logits = [&] {
    std::vector<Request*> constrained;
    for (Request* r : logit_req)
      if (r->matcher) constrained.push_back(r);
    if (constrained.empty()) return model_.forward(b);
    const int64_t words = grammar::mask_words(model_.config().vocab_size);
    std::exception_ptr mask_error;
    std::thread masker([&] {
      try {
        for (Request* r : constrained) {
          r->mask.assign(static_cast<size_t>(words), 0u);
          r->matcher->fill_mask(r->mask.data());
        }
      } catch (...) {
        mask_error = std::current_exception();
      }
    });
    struct Join {  // also when the forward throws: a joinable std::thread must not be destroyed
      std::thread& t;
      ~Join() {
        if (t.joinable()) t.join();
      }
    } join{masker};
    Tensor out = model_.forward(b);
    masker.join();
    if (mask_error) std::rethrow_exception(mask_error);
    return out;
  }();
  for (size_t i = 0; i < in_step.size(); ++i) {
    in_step[i]->n_cached += b.seqs[i].n;
    publish_blocks(*in_step[i]);
  }
  sample_rows(logit_req, logits);
  const EpStats es = model_.ep_stats();
  {
    std::lock_guard lk(mu_);
    ++steps_;
    for (size_t i = 0; i < in_step.size(); ++i)
      (b.seqs[i].n == 1 && in_step[i]->n_cached > in_step[i]->n_prompt ? decode_tokens_ : prefill_tokens_) +=
          b.seqs[i].n;
    comm_s_ += es.comm_wait_s;
    comm_bytes_ += es.bytes_sent;
    if (steps_ % 8 == 1) load_shared_ = model_.expert_load();
    if (const EplbReport* r = model_.eplb_report()) eplb_shared_ = *r;
  }
  return true;
}

void ModelEngine::fail_all(const std::string& why) {
  failed_ = true;
  for (auto& r : running_) r->out->finish(Finish::error, why);
  for (auto& r : waiting_) r->out->finish(Finish::error, why);
  std::lock_guard lk(mu_);
  for (auto& r : incoming_) r->out->finish(Finish::error, why);
}

void ModelEngine::run() {
  Communicator* w = model_.world();
  const bool multi = w && w->size() > 1;
  // Requests still running this long after a stop request are cut (finish "length"):
  // SIGTERM must end the server in bounded time.
  constexpr double kDrainS = 20;
  Clock::time_point last_plan = Clock::now(), stop_at{};
  ready_ = true;
  try {
    while (true) {
      {
        std::lock_guard lk(mu_);
        while (!incoming_.empty()) {
          waiting_.push_back(std::move(incoming_.front()));
          incoming_.pop_front();
        }
      }
      const bool stopping = stop_requested_;
      if (stopping && stop_at == Clock::time_point{}) stop_at = Clock::now();
      if (stopping) {
        for (auto& r : waiting_) r->out->finish(Finish::error, "the server is shutting down");
        waiting_.clear();
      }
      const bool cut = stopping && std::chrono::duration<double>(Clock::now() - stop_at).count() > kDrainS;
      // Leave: finished, cancelled (the client went away), or cut by the drain deadline.
      for (auto it = waiting_.begin(); it != waiting_.end();)
        if ((*it)->out->cancelled()) {
          (*it)->out->finish(Finish::cancelled);
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      for (auto it = running_.begin(); it != running_.end();) {
        Request& r = **it;
        Finish f = r.done;
        if (f == Finish::none && r.out->cancelled()) f = Finish::cancelled;
        if (f == Finish::none && cut) f = Finish::length;
        if (f != Finish::none) retire(r, f);
        it = (f != Finish::none) ? running_.erase(it) : it + 1;
      }
      update_shared();
      if (running_.empty() && waiting_.empty()) {
        if (stopping) break;
        if (multi && std::chrono::duration<double>(Clock::now() - last_plan).count() >= opt_.heartbeat_s) {
          StepPlan idle;
          broadcast_plan(*w, idle);
          last_plan = Clock::now();
        }
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(20), [&] { return !incoming_.empty() || stop_requested_; });
        continue;
      }
      if (step()) {
        last_plan = Clock::now();
      } else if (multi && std::chrono::duration<double>(Clock::now() - last_plan).count() >= opt_.heartbeat_s) {
        StepPlan idle;  // nothing ran (a preemption to make room): the others still wait
        broadcast_plan(*w, idle);
        last_plan = Clock::now();
      }
    }
    if (multi) {
      StepPlan stop;
      stop.kind = PlanKind::stop;
      broadcast_plan(*w, stop);
    }
  } catch (const std::exception& e) {
    fail_all(e.what());
    throw;
  }
}

std::string ModelEngine::metrics() const {
  std::lock_guard lk(mu_);
  const KvCacheShape& ks = model_.cache().shape();
  std::string s;
  auto gauge = [&](const char* name, const char* help, const char* type, double v) {
    s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  gauge("moe_ep_requests_running", "Requests in the running batch.", "gauge", static_cast<double>(n_running_shared_));
  gauge("moe_ep_requests_waiting", "Requests waiting for a slot or KV blocks.", "gauge",
        static_cast<double>(n_waiting_shared_ + static_cast<int64_t>(incoming_.size())));
  gauge("moe_ep_kv_cache_blocks_used", "KV-cache blocks held by requests.", "gauge", static_cast<double>(kv_used_shared_));
  gauge("moe_ep_kv_cache_blocks_cached", "KV-cache blocks no request holds whose content the prefix cache keeps.",
        "gauge", static_cast<double>(kv_cached_shared_));
  gauge("moe_ep_kv_cache_blocks_free", "KV-cache blocks neither held nor cached.", "gauge",
        static_cast<double>(ks.n_blocks - kv_used_shared_ - kv_cached_shared_));
  gauge("moe_ep_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (first admissions).",
        "counter", static_cast<double>(prefix_queries_));
  gauge("moe_ep_prefix_cache_hits_total", "Prompt tokens read from the prefix cache instead of prefilled.",
        "counter", static_cast<double>(prefix_hits_));
  gauge("moe_ep_num_preemptions_total", "Running requests preempted to give their KV blocks to older ones.",
        "counter", static_cast<double>(preemptions_));
  gauge("moe_ep_kv_cache_blocks_total", "KV-cache blocks in the pool.", "gauge", static_cast<double>(ks.n_blocks));
  gauge("moe_ep_kv_cache_usage_ratio", "Fraction of the KV-cache blocks in use.", "gauge",
        ks.n_blocks ? static_cast<double>(kv_used_shared_) / ks.n_blocks : 0.0);
  gauge("moe_ep_engine_steps_total", "Forward steps run.", "counter", static_cast<double>(steps_));
  gauge("moe_ep_engine_prefill_tokens_total", "Prompt tokens run through the model.", "counter",
        static_cast<double>(prefill_tokens_));
  gauge("moe_ep_engine_decode_tokens_total", "Decode tokens run through the model.", "counter",
        static_cast<double>(decode_tokens_));
  gauge("moe_ep_engine_failed", "1 once the engine has failed (requests get 503).", "gauge", failed_ ? 1.0 : 0.0);
  gauge("moe_ep_ep_comm_wait_seconds_total", "Time rank 0 spent blocked in expert-parallel communication.", "counter",
        comm_s_);
  gauge("moe_ep_ep_bytes_sent_total", "Expert-parallel payload bytes rank 0 sent.", "counter", comm_bytes_);
  if (eplb_shared_) {
    gauge("moe_ep_eplb_rebalances_total", "Online expert rebalances (--eplb-interval) begun.", "counter",
          static_cast<double>(eplb_shared_->rebalances));
    gauge("moe_ep_eplb_slots_moved_total", "Expert slots that changed rank, over all ranks and layers.", "counter",
          static_cast<double>(eplb_shared_->slots_moved));
    gauge("moe_ep_eplb_bytes_moved_total", "Expert weight bytes sent by all ranks in rebalances.", "counter",
          eplb_shared_->bytes_moved);
    gauge("moe_ep_eplb_stall_seconds_total", "Time rank 0's step loop spent in rebalances.", "counter",
          eplb_shared_->stall_s);
    gauge("moe_ep_eplb_imbalance_before", "Last rebalance: max over mean rows per rank before (mean over layers).",
          "gauge", eplb_shared_->imbalance_before);
    gauge("moe_ep_eplb_imbalance_after", "Last rebalance: max over mean rows per rank after (mean over layers).",
          "gauge", eplb_shared_->imbalance_after);
  }
  s += "# HELP moe_ep_expert_load_max_over_mean Tokens routed to the busiest expert over the mean, per MoE layer.\n"
       "# TYPE moe_ep_expert_load_max_over_mean gauge\n";
  for (size_t l = 0; l < load_shared_.size(); ++l) {
    const auto& row = load_shared_[l];
    if (row.empty()) continue;
    const int64_t mx = *std::max_element(row.begin(), row.end());
    const int64_t tot = std::accumulate(row.begin(), row.end(), int64_t{0});
    s += fmt::format("moe_ep_expert_load_max_over_mean{{layer=\"{}\"}} {}\n", l,
                     tot > 0 ? static_cast<double>(mx) * row.size() / tot : 0.0);
  }
  return s;
}

void run_follower(Model& model) {
  Communicator& w = *model.world();
  while (true) {
    StepPlan plan;
    broadcast_plan(w, plan);
    if (plan.kind == PlanKind::stop) return;
    if (plan.kind == PlanKind::idle) continue;
    for (size_t i = 0; i < plan.batch.seqs.size(); ++i) model.cache().set_blocks(plan.batch.seqs[i].slot, plan.blocks[i]);
    model.forward(plan.batch);
  }
}

}  // namespace moe::serve
