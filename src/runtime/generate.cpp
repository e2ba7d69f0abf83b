#include "runtime/generate.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/clock.h"
#include "runtime/runner.h"

namespace moe {

namespace {

// This rank's requests (round-robin over DP replicas), each with its own cache slot.
std::vector<Sequence> own_sequences(Model& m, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (static_cast<int>(i % m.dp_size()) != m.dp_rank()) continue;
    Sequence s;
    s.id = static_cast<int64_t>(i);
    s.slot = static_cast<int32_t>(seqs.size());
    s.tokens = prompts[i];
    s.n_prompt = static_cast<int64_t>(prompts[i].size());
    seqs.push_back(std::move(s));
  }
  MOE_CHECK(static_cast<int64_t>(seqs.size()) <= m.cache().n_slots(),
            "{} requests on this replica but the KV cache has {} sequence slots", seqs.size(), m.cache().n_slots());
  return seqs;
}

// Every rank receives the records of the first rank of each replica, in rank order.
// A record is int64 words: [id, n, values...]; values are raw 8-byte words.
std::vector<int64_t> gather_from_replica_leaders(Model& m, const std::vector<int64_t>& mine) {
  Communicator* w = m.world();
  if (!w || w->size() == 1) return mine;
  const bool leader = m.replica()->rank() == 0;
  const size_t bytes = leader ? mine.size() * sizeof(int64_t) : 0;
  std::vector<size_t> all(w->size());
  w->all_gather(&bytes, sizeof bytes, all.data());
  size_t total = 0;
  for (size_t b : all) total += b;
  std::vector<int64_t> out(total / sizeof(int64_t));
  w->all_gather_v(mine.data(), bytes, out.data(), all);
  return out;
}

bool is_eos(const ModelConfig& c, const GenerateOptions& opt, int32_t t) {
  return std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), t) != c.eos_token_ids.end() ||
         std::find(opt.extra_eos.begin(), opt.extra_eos.end(), t) != opt.extra_eos.end();
}

}  // namespace

Tensor prefill_logits(Model& m, const std::vector<std::vector<int32_t>>& prompts) {
  const ModelConfig& c = m.config();
  validate_prompts(c, prompts, m.cache().max_seq(), 0);
  std::vector<Sequence> seqs = own_sequences(m, prompts);
  std::vector<Sequence*> run;
  for (auto& s : seqs) run.push_back(&s);
  const StepBatch b = prepare_step(run, true);
  const Tensor logits = m.forward(b);  // [T, V]
  commit_step(run);
  const int64_t V = c.vocab_size;
  std::vector<int64_t> rec;
  int64_t row = 0;
  for (const Sequence& s : seqs) {
    rec.push_back(s.id);
    rec.push_back(s.n_prompt * V);
    const size_t at = rec.size();
    rec.resize(at + (s.n_prompt * V + 1) / 2);  // floats packed two per word
    std::memcpy(rec.data() + at, logits.data<float>() + row * V, s.n_prompt * V * sizeof(float));
    row += s.n_prompt;
  }
  const std::vector<int64_t> all = gather_from_replica_leaders(m, rec);
  int64_t S = 0;
  for (const auto& p : prompts) S = std::max<int64_t>(S, static_cast<int64_t>(p.size()));
  const int64_t B = static_cast<int64_t>(prompts.size());
  Tensor out = Tensor::zeros({B, S, V}, DType::F32);
  for (size_t i = 0; i < all.size();) {
    const int64_t id = all[i], n = all[i + 1];
    std::memcpy(out.data<float>() + id * S * V, all.data() + i + 2, n * sizeof(float));
    i += 2 + (n + 1) / 2;
  }
  return out;
}

GenerateResult generate(Model& m, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opt) {
  const ModelConfig& c = m.config();
  MOE_CHECK(opt.max_new_tokens >= 1, "--max-new-tokens must be at least 1, got {}", opt.max_new_tokens);
  validate_prompts(c, prompts, m.cache().max_seq(), opt.max_new_tokens);
  const int64_t V = c.vocab_size, B = static_cast<int64_t>(prompts.size());
  const int64_t Vs = opt.sample_vocab > 0 ? std::min(V, opt.sample_vocab) : V;  // ids a draw may pick
  std::vector<Sequence> seqs = own_sequences(m, prompts);
  GenerateResult res;
  res.step_logits.assign(B, {});
  m.reset_expert_load();
  Communicator* world = m.world();
  Communicator* replica = m.replica();

  for (int64_t step = 0;; ++step) {
    std::vector<Sequence*> run;
    for (auto& s : seqs)
      if (!s.done) run.push_back(&s);
    // Lock-step: stop only when no replica has work left.
    float active = static_cast<float>(run.size());
    if (world && world->size() > 1) {
      if (replica->rank() != 0) active = 0;  // count each replica once
      world->all_reduce_sum(&active, 1);
    }
    if (active == 0) {
      res.steps = step;
      break;
    }
    // A step with prompt tokens in it is prefill (chunks of a long prompt, with the
    // decodes of sequences already past theirs); the rest are decode steps.
    bool prefill = false;
    for (const Sequence* s : run) prefill = prefill || s->n_cached < s->n_prompt;
    StepBatch b = prepare_step(run, false, opt.prefill_chunk);
    // The sequences whose step reaches their last token: a logits row each, sampled.
    // (A sequence in the middle of its prompt gets none.)
    std::vector<Sequence*> emit;
    for (Sequence* s : run)
      if (step_reaches_end(*s)) emit.push_back(s);
    // Only the sampler reads these logits (unless they are kept): under a
    // vocabulary-parallel lm_head the ranks then send their best few, not their slices.
    if (!opt.keep_logits) b.logit_top_k.assign(b.logit_rows.size(), gathered_top_k(opt.sampling, V - Vs));
    const double t0 = now_s();
    const bool profiling = prof::enabled();  // else no snapshots: nothing is timed
    const prof::Totals stages0 = profiling ? prof::snapshot() : prof::Totals{};
    const Tensor logits = m.forward(b);  // [emit.size(), V]
    commit_step(run);
    run = std::move(emit);
    std::vector<int32_t> picked(run.size());
    {
      prof::Scope ps(prof::kSample);
      for (size_t i = 0; i < run.size(); ++i) {
        const float* lg = logits.data<float>() + i * V;
        picked[i] = sample_token(lg, Vs, opt.sampling, run[i]->id, run[i]->n_generated());
        if (opt.keep_logits) res.step_logits[run[i]->id].insert(res.step_logits[run[i]->id].end(), lg, lg + V);
      }
    }
    // picked[n + i] = 1: request i stops here (the leader's on_token said so).
    const size_t n = run.size();
    picked.resize(2 * n, 0);
    const bool leader = !replica || replica->rank() == 0;
    if (leader && opt.on_token)
      for (size_t i = 0; i < n; ++i)
        if (opt.ignore_eos || !is_eos(c, opt, picked[i])) picked[n + i] = opt.on_token(run[i]->id, picked[i]) ? 1 : 0;
    if (replica && replica->size() > 1 && n > 0) replica->broadcast(picked.data(), picked.size() * sizeof(int32_t), 0);
    for (size_t i = 0; i < n; ++i) {
      Sequence& s = *run[i];
      s.tokens.push_back(picked[i]);
      if (s.n_generated() >= opt.max_new_tokens || (!opt.ignore_eos && is_eos(c, opt, picked[i])) || picked[n + i])
        s.done = true;
    }
    const double dt = now_s() - t0;
    if (profiling) (prefill ? res.prefill_stages : res.decode_stages) += prof::snapshot() - stages0;
    if (prefill) {
      res.prefill_s += dt;
      res.prefill_tokens += b.n_tokens();
    } else {
      res.decode_s += dt;
      res.decode_tokens += b.n_tokens();
      ++res.decode_steps;
    }
  }

  // Gather the generated ids of every replica.
  std::vector<int64_t> rec;
  for (const Sequence& s : seqs) {
    rec.push_back(s.id);
    rec.push_back(s.n_generated());
    for (int64_t i = s.n_prompt; i < static_cast<int64_t>(s.tokens.size()); ++i) rec.push_back(s.tokens[i]);
  }
  const std::vector<int64_t> all = gather_from_replica_leaders(m, rec);
  res.tokens.assign(B, {});
  for (size_t i = 0; i < all.size();) {
    const int64_t id = all[i], n = all[i + 1];
    for (int64_t j = 0; j < n; ++j) res.tokens[id].push_back(static_cast<int32_t>(all[i + 2 + j]));
    i += 2 + n;
  }
  // Token counts and expert load summed over replicas (each replica counted once).
  res.expert_load = m.expert_load();
  if (const EplbReport* r = m.eplb_report()) res.eplb = *r;
  if (world && world->size() > 1) {
    const bool lead = replica->rank() == 0;
    std::vector<float> v = {lead ? static_cast<float>(res.prefill_tokens) : 0.f,
                            lead ? static_cast<float>(res.decode_tokens) : 0.f};
    for (auto& row : res.expert_load)
      for (int64_t x : row) v.push_back(lead ? static_cast<float>(x) : 0.f);
    world->all_reduce_sum(v.data(), v.size());
    res.prefill_tokens = static_cast<int64_t>(v[0]);
    res.decode_tokens = static_cast<int64_t>(v[1]);
    size_t k = 2;
    for (auto& row : res.expert_load)
      for (int64_t& x : row) x = static_cast<int64_t>(v[k++]);
  }
  return res;
}

}  // namespace moe

