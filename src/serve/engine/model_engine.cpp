#include "serve/engine/model_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
  std::vector<int32_t> blocks;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t n_prompt = 0, n_cached = 0;
  std::unique_ptr<text::TextStream> text;
  std::unordered_map<int32_t, int32_t> counts;  // generated token -> times (penalties)
  Finish done = Finish::none;                   // set by sampling; retired before the next step
  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
};

namespace {

int64_t blocks_for(int64_t positions, int64_t block_size) { return (positions + block_size - 1) / block_size; }

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
    : model_(model), tok_(tok), tmpl_(tmpl), opt_(std::move(opt)) {
  const KvCache& c = model_.cache();
  MOE_CHECK(c.shape().paged(), "internal: the served model needs a paged KV cache");
  MOE_CHECK(opt_.max_num_seqs >= 1 && opt_.max_num_seqs <= c.n_slots(),
            "--max-num-seqs {} must be in [1, {}] (the KV cache's sequence slots)", opt_.max_num_seqs, c.n_slots());
  MOE_CHECK(opt_.max_batch_tokens >= opt_.max_num_seqs,
            "--max-batch-tokens {} must be at least --max-num-seqs {} (every running request decodes one token per "
            "step)",
            opt_.max_batch_tokens, opt_.max_num_seqs);
  for (int64_t b = c.shape().n_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
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
  const KvCache& c = model_.cache();
  if (blocks_for(n + p.max_tokens, c.block_size()) > c.shape().n_blocks)
    throw ServeError{400, "invalid_request_error",
                     fmt::format("the request needs {} positions but the KV cache holds {} in all (--kv-cache-mem)",
                                 n + p.max_tokens, c.shape().n_blocks * c.block_size()),
                     "max_tokens"};
  auto r = std::make_unique<Request>();
  r->out = std::make_shared<Stream>();
  r->out->set_prompt_tokens(n);
  r->tokens = p.prompt_ids;
  r->n_prompt = n;
  text::DecodeOptions dopt;
  dopt.skip_special_tokens = p.skip_special_tokens;
  r->text = std::make_unique<text::TextStream>(tok_, p.stop, dopt);
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
  for (int32_t b : r.blocks) free_blocks_.push_back(b);
  r.blocks.clear();
  if (r.slot >= 0) free_slots_.push_back(r.slot);
  r.slot = -1;
}

void ModelEngine::admit() {
  const int64_t bs = model_.cache().block_size();
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < opt_.max_num_seqs && !free_slots_.empty()) {
    Request& r = *waiting_.front();
    const int64_t need = blocks_for(r.n_prompt + r.p.max_tokens, bs);
    if (need > static_cast<int64_t>(free_blocks_.size())) break;  // FIFO: the head waits for blocks
    r.slot = free_slots_.back();
    free_slots_.pop_back();
    r.blocks.assign(free_blocks_.end() - need, free_blocks_.end());
    free_blocks_.resize(free_blocks_.size() - need);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void ModelEngine::sample_rows(const std::vector<Request*>& rows, const Tensor& logits) {
  const int64_t V = model_.config().vocab_size;
  std::vector<float> row, lp;
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    const float* lg = logits.data<float>() + static_cast<int64_t>(i) * V;
    const bool penalised = (r.p.presence_penalty != 0 || r.p.frequency_penalty != 0) && !r.counts.empty();
    if (penalised) {  // OpenAI: logit -= count * frequency + (count > 0) * presence, generated tokens only
      row.assign(lg, lg + V);
      for (auto [id, n] : r.counts) row[id] -= static_cast<float>(n * r.p.frequency_penalty + r.p.presence_penalty);
      lg = row.data();
    }
    // The draw depends on (seed, step) only: the same seed gives the same text alone or
    // in any batch.
    const int32_t tok = sample_token(lg, V, r.p.sampling, 0, static_cast<uint64_t>(r.n_generated()));
    TokenLogprob tl;
    tl.id = tok;
    if (r.p.top_logprobs >= 0) {
      log_softmax(lg, V, lp);
      tl.logprob = lp[tok];
      std::vector<int32_t> order(V);
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = std::min<int64_t>(r.p.top_logprobs, V);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
      for (int64_t j = 0; j < k; ++j) tl.top.emplace_back(order[j], lp[order[j]]);
    }
    r.tokens.push_back(tok);
    ++r.counts[tok];
    const bool eos = !r.p.ignore_eos && std::find(opt_.eos_ids.begin(), opt_.eos_ids.end(), tok) != opt_.eos_ids.end();
    // The EOS token counts as generated (usage) but its text is not returned (as vLLM).
    const text::TextStream::Piece piece = eos ? text::TextStream::Piece{} : r.text->push(tok);
    r.out->append(piece.text, tl);
    if (piece.stopped || eos) r.done = Finish::stop;
    else if (r.n_generated() >= r.p.max_tokens) r.done = Finish::length;
  }
}

bool ModelEngine::step() {
  StepPlan plan;
  plan.kind = PlanKind::step;
  StepBatch& b = plan.batch;
  std::vector<Request*> in_step, logit_req;
  int64_t budget = opt_.max_batch_tokens;
  auto add = [&](Request& r, int64_t n, bool wants_logits) {
    SeqSpan sp;
    sp.slot = r.slot;
    sp.first = b.n_tokens();
    sp.n = n;
    sp.start_pos = r.n_cached;
    for (int64_t p = r.n_cached; p < r.n_cached + n; ++p) {
      b.tokens.push_back(r.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
    }
    if (wants_logits) {
      b.logit_rows.push_back(b.n_tokens() - 1);
      logit_req.push_back(&r);
    }
    b.seqs.push_back(sp);
    plan.blocks.push_back(r.blocks);
    in_step.push_back(&r);
    budget -= n;
  };
  for (auto& r : running_)
    if (r->n_cached >= r->n_prompt) add(*r, 1, true);  // decode: the newest token
  for (auto& r : running_) {
    if (r->n_cached >= r->n_prompt || budget <= 0) continue;
    const int64_t n = std::min(r->n_prompt - r->n_cached, budget);
    add(*r, n, r->n_cached + n == r->n_prompt);  // a chunk that ends the prompt samples
  }
  if (b.n_tokens() == 0) return false;
  Communicator* w = model_.world();
  if (w && w->size() > 1) broadcast_plan(*w, plan);
  for (size_t i = 0; i < b.seqs.size(); ++i) model_.cache().set_blocks(b.seqs[i].slot, plan.blocks[i]);
  const Tensor logits = model_.forward(b);
  for (size_t i = 0; i < in_step.size(); ++i) in_step[i]->n_cached += b.seqs[i].n;
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
      admit();
      {
        std::lock_guard lk(mu_);
        n_waiting_shared_ = static_cast<int64_t>(waiting_.size());
        n_running_shared_ = static_cast<int64_t>(running_.size());
        kv_used_shared_ = model_.cache().shape().n_blocks - static_cast<int64_t>(free_blocks_.size());
      }
      if (running_.empty()) {
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
      step();
      last_plan = Clock::now();
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
