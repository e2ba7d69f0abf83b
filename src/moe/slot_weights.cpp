#include "moe/slot_weights.h"

#include <vector>

#include "core/check.h"

namespace moe {

MoeLayerWeights load_slot_weights(const Placement& p, int ep_rank,
                                  const std::function<MoeLayerWeights(int64_t, int64_t)>& load_range) {
  const std::vector<int32_t> experts = p.rank_experts(ep_rank);
  const auto fix = [&](MoeLayerWeights& w) {
    w.expert_begin = p.begin(ep_rank);
    w.expert_end = p.end(ep_rank);
    w.slot_expert = p.identity() ? std::vector<int32_t>{} : p.slot_experts();
  };
  if (p.identity()) {
    MoeLayerWeights w = load_range(p.begin(ep_rank), p.end(ep_rank));
    fix(w);
    return w;
  }
  MoeLayerWeights out;
  const int64_t n = static_cast<int64_t>(experts.size());
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && experts[j] == experts[j - 1] + 1) ++j;
    MoeLayerWeights run = load_range(experts[i], experts[j - 1] + 1);
    MOE_CHECK(run.w13.n_experts == j - i && run.w2.n_experts == j - i,
              "internal: a load of experts [{}, {}) returned {} experts", experts[i], experts[j - 1] + 1,
              run.w13.n_experts);
    if (i == 0) {
      out = run;  // router, shared experts, tables of all experts: from the first run
      out.w13 = make_packed_like(run.w13, n);
      out.w2 = make_packed_like(run.w2, n);
    }
    for (int64_t s = i; s < j; ++s) {
      copy_expert(out.w13, s, run.w13, s - i);
      copy_expert(out.w2, s, run.w2, s - i);
    }
    i = j;
  }
  fix(out);
  return out;
}

}  // namespace moe
