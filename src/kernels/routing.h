// Routing (select_experts): router logits -> top-k expert ids and weights per token.
//
//   scores   = softmax(logits) or sigmoid(logits)                       [T, E] f32
//   choice   = scores + correction_bias (noaux_tc; else scores)
//   groups   : with n_group > 1 keep only the topk_group best groups, a group's
//              score being max(choice) (DeepSeek-V2) or the sum of its top-2 (V3)
//   ids      = top-k of choice among kept experts; ties go to the lower expert id
//   weights  = scores[ids] (the *unbiased* scores), renormalised to sum 1 if asked,
//              then times routed_scaling_factor
//
// ids come out in descending order of `choice`, so the slot order j = 0..k-1 is
// deterministic, and so is every sum over slots.
#pragma once

#include <cstdint>

namespace moe {

enum class Scoring : uint8_t { Softmax, Sigmoid };
enum class GroupScore : uint8_t { Max, SumTop2 };

struct RoutingConfig {
  Scoring scoring = Scoring::Softmax;
  int64_t n_group = 1;     // 1: no group limit
  int64_t topk_group = 1;  // groups kept when n_group > 1
  GroupScore group_score = GroupScore::Max;
  bool use_correction_bias = false;  // noaux_tc: bias selects, does not weigh
  bool renormalize = false;          // weights /= max(sum, renorm_min) (+ renorm_eps)
  float renorm_eps = 0.f;            // DeepSeek-V3 adds 1e-20 to the sum
  float renorm_min = 0.f;            // ERNIE clamps the sum below at moe_norm_min
  float scaling = 1.f;               // routed_scaling_factor
};

struct RoutingParams {
  RoutingConfig cfg;
  int64_t n_tokens = 0;
  int64_t n_experts = 0;
  int64_t top_k = 0;
  const float* logits = nullptr;           // [n_tokens, n_experts]
  const float* correction_bias = nullptr;  // [n_experts], when cfg.use_correction_bias
  float* weights = nullptr;                // out [n_tokens, top_k]
  int32_t* ids = nullptr;                  // out [n_tokens, top_k]
};

// Fast path: one pass per token, partial selection; parallel over tokens.
void route(const RoutingParams& p);
// Brute force: full sort of every expert by (score desc, id asc). For tests.
void route_reference(const RoutingParams& p);

}  // namespace moe
