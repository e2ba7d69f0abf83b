#include "serve/engine/step_plan.h"

#include "comm/communicator.h"
#include "core/check.h"

namespace moe::serve {

void broadcast_plan(Communicator& world, StepPlan& plan) {
  if (world.size() == 1) return;
  // Header: kind, tokens, seqs, logit rows, block entries.
  int64_t head[5] = {};
  std::vector<int32_t> words;
  if (world.rank() == 0) {
    const StepBatch& b = plan.batch;
    int64_t n_blocks = 0;
    for (const auto& bl : plan.blocks) n_blocks += static_cast<int64_t>(bl.size());
    head[0] = static_cast<int64_t>(plan.kind);
    head[1] = b.n_tokens();
    head[2] = static_cast<int64_t>(b.seqs.size());
    head[3] = static_cast<int64_t>(b.logit_rows.size());
    head[4] = n_blocks;
    MOE_CHECK(b.logit_top_k.size() == b.logit_rows.size(), "internal: {} top-k limits for {} logit rows",
              b.logit_top_k.size(), b.logit_rows.size());
    words.reserve(2 * head[1] + 5 * head[2] + 2 * head[3] + head[4]);
    words.insert(words.end(), b.tokens.begin(), b.tokens.end());
    words.insert(words.end(), b.positions.begin(), b.positions.end());
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      const SeqSpan& s = b.seqs[i];
      // Steps are bounded by --max-batch-tokens and --max-model-len: int32 holds them.
      words.push_back(s.slot);
      words.push_back(static_cast<int32_t>(s.first));
      words.push_back(static_cast<int32_t>(s.n));
      words.push_back(static_cast<int32_t>(s.start_pos));
      words.push_back(static_cast<int32_t>(plan.blocks[i].size()));
    }
    for (int64_t r : b.logit_rows) words.push_back(static_cast<int32_t>(r));
    words.insert(words.end(), b.logit_top_k.begin(), b.logit_top_k.end());
    for (const auto& bl : plan.blocks) words.insert(words.end(), bl.begin(), bl.end());
  }
  world.broadcast(head, sizeof head, 0);
  if (world.rank() == 0) {
    if (!words.empty()) world.broadcast(words.data(), words.size() * sizeof(int32_t), 0);
    return;
  }
  MOE_CHECK(head[0] >= 0 && head[0] <= 2 && head[1] >= 0 && head[2] >= 0 && head[3] >= 0 && head[4] >= 0,
            "internal: malformed step plan header");
  const int64_t n_words = 2 * head[1] + 5 * head[2] + 2 * head[3] + head[4];
  words.resize(n_words);
  if (n_words > 0) world.broadcast(words.data(), words.size() * sizeof(int32_t), 0);
  plan = StepPlan{};
  plan.kind = static_cast<PlanKind>(head[0]);
  StepBatch& b = plan.batch;
  size_t at = 0;
  b.tokens.assign(words.begin(), words.begin() + head[1]);
  at += head[1];
  b.positions.assign(words.begin() + at, words.begin() + at + head[1]);
  at += head[1];
  std::vector<int64_t> n_bl;
  for (int64_t i = 0; i < head[2]; ++i, at += 5) {
    SeqSpan s;
    s.slot = words[at];
    s.first = words[at + 1];
    s.n = words[at + 2];
    s.start_pos = words[at + 3];
    n_bl.push_back(words[at + 4]);
    b.seqs.push_back(s);
  }
  for (int64_t i = 0; i < head[3]; ++i) b.logit_rows.push_back(words[at++]);
  for (int64_t i = 0; i < head[3]; ++i) b.logit_top_k.push_back(words[at++]);
  for (int64_t n : n_bl) {
    MOE_CHECK(at + n <= words.size(), "internal: malformed step plan");
    plan.blocks.emplace_back(words.begin() + at, words.begin() + at + n);
    at += n;
  }
}

}  // namespace moe::serve
