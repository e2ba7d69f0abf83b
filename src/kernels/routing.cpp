#include "kernels/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "core/check.h"

namespace moe {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// NaN sorts below everything, so a NaN logit can never win a slot, and a
// selection over n >= k candidates always yields k valid ids.
inline float key(float v) { return std::isnan(v) ? kNegInf : v; }

// a before b: larger key first, then lower id.
inline bool better(float ka, int32_t ia, float kb, int32_t ib) { return ka > kb || (ka == kb && ia < ib); }

void check_params(const RoutingParams& p) {
  MOE_CHECK(p.n_experts > 0 && p.top_k > 0 && p.top_k <= p.n_experts,
            "routing: top_k={} must be in [1, n_experts={}]", p.top_k, p.n_experts);
  MOE_CHECK(p.n_tokens == 0 || (p.logits && p.weights && p.ids), "routing: null buffer");
  MOE_CHECK(!p.cfg.use_correction_bias || p.correction_bias,
            "routing: the config asks for e_score_correction_bias but none was given");
  if (p.cfg.n_group > 1) {
    MOE_CHECK(p.n_experts % p.cfg.n_group == 0 && p.cfg.topk_group >= 1 && p.cfg.topk_group <= p.cfg.n_group &&
                  p.top_k <= p.cfg.topk_group * (p.n_experts / p.cfg.n_group),
              "routing: n_group={} topk_group={} cannot pick top_k={} of {} experts", p.cfg.n_group,
              p.cfg.topk_group, p.top_k, p.n_experts);
  }
}

void compute_scores(const RoutingConfig& cfg, const float* logits, int64_t n, float* scores) {
  if (cfg.scoring == Scoring::Sigmoid) {
    for (int64_t e = 0; e < n; ++e) scores[e] = 1.f / (1.f + std::exp(-logits[e]));
    return;
  }
  float m = kNegInf;
  for (int64_t e = 0; e < n; ++e) m = std::max(m, logits[e]);
  float sum = 0.f;
  for (int64_t e = 0; e < n; ++e) {
    scores[e] = std::exp(logits[e] - m);
    sum += scores[e];
  }
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < n; ++e) scores[e] *= inv;
}

float group_score(const RoutingConfig& cfg, const float* choice, int64_t n) {
  if (cfg.group_score == GroupScore::Max) {
    float m = kNegInf;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, key(choice[i]));
    return m;
  }
  float a = kNegInf, b = kNegInf;  // top two
  for (int64_t i = 0; i < n; ++i) {
    const float v = key(choice[i]);
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return n >= 2 ? a + b : a;
}

void finish_weights(const RoutingConfig& cfg, const float* scores, const int32_t* ids, int64_t k, float* w) {
  float sum = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    w[j] = scores[ids[j]];
    sum += w[j];
  }
  const float denom = cfg.renormalize ? std::max(sum + cfg.renorm_eps, cfg.renorm_min) : 1.f;
  for (int64_t j = 0; j < k; ++j) w[j] = w[j] / denom * cfg.scaling;
}

// Marks the experts of the kept groups in `allowed`.
void select_groups(const RoutingConfig& cfg, const float* choice, int64_t n_experts, std::vector<char>& allowed,
                   std::vector<std::pair<float, int32_t>>& gscore) {
  const int64_t per = n_experts / cfg.n_group;
  gscore.resize(cfg.n_group);
  for (int64_t g = 0; g < cfg.n_group; ++g)
    gscore[g] = {group_score(cfg, choice + g * per, per), static_cast<int32_t>(g)};
  std::partial_sort(gscore.begin(), gscore.begin() + cfg.topk_group, gscore.end(),
                    [](const auto& a, const auto& b) { return better(a.first, a.second, b.first, b.second); });
  std::fill(allowed.begin(), allowed.end(), 0);
  for (int64_t i = 0; i < cfg.topk_group; ++i)
    std::fill_n(allowed.begin() + gscore[i].second * per, per, 1);
}

}  // namespace

void route(const RoutingParams& p) {
  check_params(p);
  const RoutingConfig& cfg = p.cfg;
  const int64_t E = p.n_experts, k = p.top_k;
#pragma omp parallel if (p.n_tokens >= 64)
  {
    // Per thread, reused across calls (route runs per MoE layer per decode step).
    thread_local std::vector<float> scores, choice, best_key;
    thread_local std::vector<char> allowed;
    thread_local std::vector<std::pair<float, int32_t>> gscore;
    scores.resize(E);
    choice.resize(E);
    allowed.assign(E, 1);
    best_key.resize(k);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      compute_scores(cfg, p.logits + t * E, E, scores.data());
      for (int64_t e = 0; e < E; ++e)
        choice[e] = cfg.use_correction_bias ? scores[e] + p.correction_bias[e] : scores[e];
      if (cfg.n_group > 1) select_groups(cfg, choice.data(), E, allowed, gscore);
      // Insertion into a sorted list of the k best so far. Experts arrive in id order,
      // so a strict comparison keeps the lower id ahead on ties.
      int32_t* ids = p.ids + t * k;
      int64_t filled = 0;
      for (int64_t e = 0; e < E; ++e) {
        if (cfg.n_group > 1 && !allowed[e]) continue;
        const float v = key(choice[e]);
        if (filled == k && !(v > best_key[k - 1])) continue;
        int64_t pos = filled < k ? filled++ : k - 1;
        while (pos > 0 && v > best_key[pos - 1]) {
          best_key[pos] = best_key[pos - 1];
          ids[pos] = ids[pos - 1];
          --pos;
        }
        best_key[pos] = v;
        ids[pos] = static_cast<int32_t>(e);
      }
      finish_weights(cfg, scores.data(), ids, k, p.weights + t * k);
    }
  }
}

void route_reference(const RoutingParams& p) {
  check_params(p);
  const RoutingConfig& cfg = p.cfg;
  const int64_t E = p.n_experts, k = p.top_k;
  std::vector<float> scores(E), choice(E);
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    compute_scores(cfg, p.logits + t * E, E, scores.data());
    for (int64_t e = 0; e < E; ++e) choice[e] = scores[e] + (cfg.use_correction_bias ? p.correction_bias[e] : 0.f);
    std::vector<int32_t> order;
    if (cfg.n_group > 1) {
      // Rank groups by a full sort of their scores computed from scratch.
      const int64_t per = E / cfg.n_group;
      std::vector<int32_t> groups(cfg.n_group);
      std::vector<float> gs(cfg.n_group);
      for (int64_t g = 0; g < cfg.n_group; ++g) {
        std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        for (float& x : v) x = key(x);
        std::sort(v.begin(), v.end(), std::greater<float>());
        gs[g] = cfg.group_score == GroupScore::Max ? v[0] : (per >= 2 ? v[0] + v[1] : v[0]);
      }
      std::iota(groups.begin(), groups.end(), 0);
      std::stable_sort(groups.begin(), groups.end(), [&](int32_t a, int32_t b) { return gs[a] > gs[b]; });
      for (int64_t i = 0; i < cfg.topk_group; ++i)
        for (int64_t e = groups[i] * per; e < (groups[i] + 1) * per; ++e) order.push_back(static_cast<int32_t>(e));
      std::sort(order.begin(), order.end());
    } else {
      order.resize(E);
      std::iota(order.begin(), order.end(), 0);
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(choice[a]) > key(choice[b]); });
    std::copy_n(order.begin(), k, p.ids + t * k);
    finish_weights(cfg, scores.data(), p.ids + t * k, k, p.weights + t * k);
  }
}

}  // namespace moe
