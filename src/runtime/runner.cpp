#include "runtime/runner.h"

#include <algorithm>
#include <charconv>

#include "core/check.h"

namespace moe {

StepBatch prepare_step(const std::vector<Sequence*>& seqs, bool all_logits, int64_t max_tokens) {
  StepBatch b;
  for (Sequence* s : seqs) {
    const int64_t total = static_cast<int64_t>(s->tokens.size());
    MOE_CHECK(s->n_cached < total, "internal: sequence {} has no uncached token", s->id);
    s->n_step = total - s->n_cached;
    if (max_tokens > 0) s->n_step = std::min(s->n_step, max_tokens - b.n_tokens());
    if (s->n_step <= 0) {
      s->n_step = 0;
      continue;
    }
    SeqSpan sp;
    sp.slot = s->slot;
    sp.first = b.n_tokens();
    sp.n = s->n_step;
    sp.start_pos = s->n_cached;
    for (int64_t p = s->n_cached; p < s->n_cached + s->n_step; ++p) {
      b.tokens.push_back(s->tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      if (all_logits) b.logit_rows.push_back(b.n_tokens() - 1);
    }
    if (!all_logits && step_reaches_end(*s)) b.logit_rows.push_back(b.n_tokens() - 1);
    b.seqs.push_back(sp);
  }
  return b;
}

void commit_step(const std::vector<Sequence*>& seqs) {
  for (Sequence* s : seqs) {
    s->n_cached += s->n_step;
    s->n_step = 0;
  }
}

std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& text) {
  std::vector<std::vector<int32_t>> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(';', start);
    const std::string part = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::vector<int32_t> ids;
    size_t p = 0;
    while (p <= part.size()) {
      const size_t q = part.find(',', p);
      std::string tok = part.substr(p, q == std::string::npos ? std::string::npos : q - p);
      const size_t a = tok.find_first_not_of(" \t"), z = tok.find_last_not_of(" \t");
      tok = a == std::string::npos ? "" : tok.substr(a, z - a + 1);
      if (!tok.empty()) {
        long long v = 0;
        auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
        // The entry is quoted up to 40 characters: an @FILE of ids separated by spaces is one
        // entry of the whole file, which the message should not repeat.
        MOE_CHECK(ec == std::errc() && ptr == tok.data() + tok.size() && v >= INT32_MIN && v <= INT32_MAX,
                  "--prompt-ids: prompt {}, entry {}: '{}' is not a token id (expected integers separated by ',', "
                  "prompts by ';')",
                  out.size(), ids.size(), tok.size() > 40 ? tok.substr(0, 40) + "..." : tok);
        ids.push_back(static_cast<int32_t>(v));
      } else {
        MOE_CHECK(q == std::string::npos && (p == part.size() || part.find_first_not_of(" \t", p) == std::string::npos),
                  "--prompt-ids: prompt {} has an empty entry between commas", out.size());
      }
      if (q == std::string::npos) break;
      p = q + 1;
    }
    out.push_back(std::move(ids));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

void validate_prompts(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& prompts, int64_t max_seq,
                      int64_t max_new_tokens) {
  MOE_CHECK(!prompts.empty(), "no prompts given (--prompt-ids \"1,2,3;4,5\")");
  for (size_t i = 0; i < prompts.size(); ++i) {
    MOE_CHECK(!prompts[i].empty(), "prompt {} is empty: every prompt needs at least one token id", i);
    for (size_t j = 0; j < prompts[i].size(); ++j)
      MOE_CHECK(prompts[i][j] >= 0 && prompts[i][j] < cfg.vocab_size,
                "prompt {} token {}: id {} is out of vocabulary (vocab_size {}, ids 0..{})", i, j, prompts[i][j],
                cfg.vocab_size, cfg.vocab_size - 1);
    const int64_t need = static_cast<int64_t>(prompts[i].size()) + max_new_tokens;
    MOE_CHECK(need <= max_seq,
              "prompt {} has {} tokens; with {} new tokens it needs {} positions, over --max-seq-len {}", i,
              prompts[i].size(), max_new_tokens, need, max_seq);
  }
}

}  // namespace moe
