// Routing against brute force, and the properties every variant must keep.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "kernels/routing.h"
#include "test_util.h"

namespace moe {
namespace {

struct Case {
  int64_t E, k;
  RoutingConfig cfg;
  const char* name;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Scoring s : {Scoring::Softmax, Scoring::Sigmoid})
    for (bool bias : {false, true})
      for (bool renorm : {false, true})
        for (int groups : {1, 4}) {
          RoutingConfig c;
          c.scoring = s;
          c.use_correction_bias = bias;
          c.renormalize = renorm;
          c.scaling = renorm ? 2.5f : 1.f;
          if (groups > 1) {
            c.n_group = groups;
            c.topk_group = 2;
            c.group_score = bias ? GroupScore::SumTop2 : GroupScore::Max;
          }
          for (auto [E, k] : {std::pair<int64_t, int64_t>{8, 1}, {8, 2}, {60, 4}, {32, 8}, {128, 8}, {12, 3}}) {
            if (groups > 1 && (E % groups != 0 || k > c.topk_group * (E / groups))) continue;
            out.push_back({E, k, c, ""});
          }
        }
  return out;
}

struct Routed {
  std::vector<float> w;
  std::vector<int32_t> ids;
};

Routed run(bool reference, const RoutingConfig& cfg, const std::vector<float>& logits, const std::vector<float>& bias,
           int64_t T, int64_t E, int64_t k) {
  Routed r{std::vector<float>(T * k), std::vector<int32_t>(T * k)};
  RoutingParams p;
  p.cfg = cfg;
  p.n_tokens = T;
  p.n_experts = E;
  p.top_k = k;
  p.logits = logits.data();
  p.correction_bias = bias.data();
  p.weights = r.w.data();
  p.ids = r.ids.data();
  reference ? route_reference(p) : route(p);
  return r;
}

std::vector<float> scores_of(const RoutingConfig& cfg, const float* l, int64_t E) {
  std::vector<double> s(E);
  if (cfg.scoring == Scoring::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-double(l[e])));
  } else {
    const double m = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += s[e] = std::exp(double(l[e]) - m);
    for (double& v : s) v /= sum;
  }
  return std::vector<float>(s.begin(), s.end());
}

TEST(Routing, FastEqualsBruteForceForEveryVariant) {
  const int64_t T = 97;  // odd, and above the threshold where route() goes parallel
  int n = 0;
  for (const Case& c : cases()) {
    const Tensor logits = test::random_f32({T, c.E}, 2.f, 7 + n);
    const Tensor bias = test::random_f32({c.E}, 0.3f, 11 + n);
    std::vector<float> l(logits.data<float>(), logits.data<float>() + T * c.E);
    std::vector<float> b(bias.data<float>(), bias.data<float>() + c.E);
    const Routed fast = run(false, c.cfg, l, b, T, c.E, c.k);
    const Routed ref = run(true, c.cfg, l, b, T, c.E, c.k);
    ASSERT_EQ(fast.ids, ref.ids) << "E=" << c.E << " k=" << c.k << " case " << n;
    ASSERT_EQ(fast.w, ref.w) << "E=" << c.E << " k=" << c.k << " case " << n;
    ++n;
  }
  EXPECT_GT(n, 50);
}

TEST(Routing, PropertiesHold) {
  const int64_t T = 64;
  int n = 0;
  for (const Case& c : cases()) {
    const Tensor logits = test::random_f32({T, c.E}, 2.f, 100 + n);
    const Tensor bias = test::random_f32({c.E}, 0.3f, 200 + n);
    std::vector<float> l(logits.data<float>(), logits.data<float>() + T * c.E);
    std::vector<float> b(bias.data<float>(), bias.data<float>() + c.E);
    const Routed r = run(false, c.cfg, l, b, T, c.E, c.k);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> s = scores_of(c.cfg, &l[t * c.E], c.E);
      std::set<int32_t> uniq(r.ids.begin() + t * c.k, r.ids.begin() + (t + 1) * c.k);
      ASSERT_EQ(static_cast<int64_t>(uniq.size()), c.k) << "an expert was chosen twice";
      double sum = 0, raw_sum = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        const int32_t e = r.ids[t * c.k + j];
        ASSERT_GE(e, 0);
        ASSERT_LT(e, c.E);
        raw_sum += s[e];
        sum += r.w[t * c.k + j];
      }
      // Weights are the *unbiased* scores of the chosen experts (bias only selects).
      for (int64_t j = 0; j < c.k; ++j) {
        const int32_t e = r.ids[t * c.k + j];
        const double want = c.cfg.renormalize ? s[e] / raw_sum * c.cfg.scaling : s[e] * c.cfg.scaling;
        ASSERT_NEAR(r.w[t * c.k + j], want, 1e-5 * std::max(1.0, want));
      }
      if (c.cfg.renormalize) {
        ASSERT_NEAR(sum, c.cfg.scaling, 1e-5);
      }
      // Selection: no unchosen allowed expert beats a chosen one on the choice score.
      std::vector<float> choice(c.E);
      for (int64_t e = 0; e < c.E; ++e) choice[e] = s[e] + (c.cfg.use_correction_bias ? b[e] : 0.f);
      std::set<int64_t> allowed_groups;
      if (c.cfg.n_group > 1) {
        const int64_t per = c.E / c.cfg.n_group;
        std::vector<std::pair<double, int64_t>> gs;
        for (int64_t g = 0; g < c.cfg.n_group; ++g) {
          std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
          std::sort(v.rbegin(), v.rend());
          gs.push_back({c.cfg.group_score == GroupScore::Max ? v[0] : v[0] + v[1], g});
        }
        std::sort(gs.begin(), gs.end(), [](auto& a, auto& b2) { return a.first > b2.first; });
        for (int64_t i = 0; i < c.cfg.topk_group; ++i) allowed_groups.insert(gs[i].second);
        for (int32_t e : uniq) {
          ASSERT_TRUE(allowed_groups.count(e / per)) << "expert " << e << " in a masked group";
        }
      }
      float worst_chosen = std::numeric_limits<float>::infinity();
      for (int32_t e : uniq) worst_chosen = std::min(worst_chosen, choice[e]);
      for (int64_t e = 0; e < c.E; ++e) {
        if (uniq.count(e)) continue;
        if (c.cfg.n_group > 1 && !allowed_groups.count(e / (c.E / c.cfg.n_group))) continue;
        ASSERT_LE(choice[e], worst_chosen) << "expert " << e << " should have been chosen";
      }
    }
    ++n;
  }
}

TEST(Routing, BiasChangesSelectionNotWeights) {
  // Two experts with equal logits; a bias on the second must pick it, with the same weight.
  RoutingConfig cfg;
  cfg.scoring = Scoring::Sigmoid;
  cfg.use_correction_bias = true;
  const std::vector<float> logits = {1.f, 1.f, -3.f, -3.f};
  const Routed nob = run(false, cfg, logits, {0.f, 0.f, 0.f, 0.f}, 1, 4, 1);
  const Routed withb = run(false, cfg, logits, {0.f, 0.5f, 0.f, 0.f}, 1, 4, 1);
  EXPECT_EQ(nob.ids[0], 0);
  EXPECT_EQ(withb.ids[0], 1);
  EXPECT_FLOAT_EQ(nob.w[0], withb.w[0]);
  EXPECT_NEAR(withb.w[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  // A large bias can pull in an expert whose own score is tiny; the weight stays tiny.
  const Routed pulled = run(false, cfg, logits, {0.f, 0.f, 5.f, 0.f}, 1, 4, 1);
  EXPECT_EQ(pulled.ids[0], 2);
  EXPECT_NEAR(pulled.w[0], 1.0 / (1.0 + std::exp(3.0)), 1e-6);
}

TEST(Routing, TiesGoToLowerIdAndNaNNeverWins) {
  RoutingConfig cfg;
  const std::vector<float> flat(16, 0.25f);
  const Routed r = run(false, cfg, flat, std::vector<float>(16, 0.f), 1, 16, 4);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  std::vector<float> nan_logits(8, 0.f);
  nan_logits[0] = std::numeric_limits<float>::quiet_NaN();
  nan_logits[5] = 1.f;
  RoutingConfig sig;
  sig.scoring = Scoring::Sigmoid;
  const Routed n = run(false, sig, nan_logits, std::vector<float>(8, 0.f), 1, 8, 2);
  EXPECT_EQ(n.ids, (std::vector<int32_t>{5, 1}));
  // Groups: ties between groups also go to the lower group.
  RoutingConfig g;
  g.n_group = 4;
  g.topk_group = 1;
  const Routed gr = run(false, g, std::vector<float>(8, 0.f), std::vector<float>(8, 0.f), 1, 8, 2);
  EXPECT_EQ(gr.ids, (std::vector<int32_t>{0, 1}));
}

TEST(Routing, RejectsImpossibleConfigs) {
  RoutingConfig cfg;
  EXPECT_THROW(run(false, cfg, std::vector<float>(4), std::vector<float>(4), 1, 4, 5), Error);
  cfg.n_group = 3;  // does not divide 4
  EXPECT_THROW(run(false, cfg, std::vector<float>(4), std::vector<float>(4), 1, 4, 1), Error);
}

}  // namespace
}  // namespace moe
