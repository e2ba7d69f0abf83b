// Where a step's time goes, stage by stage (`generate --profile`): wall time of each
// stage of Model::forward, summed over the run. For machines without perf (the lent
// 16-core hosts have none) and for scaling reports: a stage whose share grows with the
// thread count is the one that does not scale.
//
// Stages run on the calling thread between parallel regions. A stage entered inside
// another on the same thread is not timed (the shared experts' GEMMs belong to "shared",
// not to "gemm1"), so on one thread the stages' wall times add up to at most the step's;
// the remainder (norms, residual adds, RoPE, KV writes, bookkeeping) is "other". Off by
// default: a disabled Scope is one load and a not-taken branch.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace moe::prof {

enum Stage : int {
  kEmbed,       // token embedding rows
  kAttnQkv,     // q, k, v projections (MLA: q or q_a/q_b, kv_a)
  kAttnCore,    // scores, softmax, V sum over the KV cache
  kAttnOut,     // o_proj
  kRoute,       // router GEMV/GEMM, top-k, token -> expert index
  kExpand,      // rows gathered (and quantised) per expert
  kGemm1,       // experts' gate+up GEMM and activation (dense MLPs too)
  kActQuant,    // W8A8/W4A8: the activated rows quantised for GEMM2
  kGemm2,       // experts' down GEMM
  kCombine,     // expert outputs weighted back into token order
  kShared,      // shared experts
  kLmHead,      // final projection to the vocabulary
  kSample,      // choosing the next token from the logits
  kStages
};

inline constexpr std::array<std::string_view, kStages> kStageNames = {
    "embed",  "attn_qkv", "attn_core", "attn_out", "route",   "expand", "gemm1",
    "act_quant", "gemm2", "combine",   "shared",   "lm_head", "sample"};

// Seconds and timed entries per stage: the totals so far (snapshot()), or a span's (the
// difference of two snapshots, summed over steps).
struct Totals {
  std::array<double, kStages> s{};
  std::array<int64_t, kStages> calls{};
  Totals& operator+=(const Totals& o) {
    for (int i = 0; i < kStages; ++i) s[i] += o.s[i], calls[i] += o.calls[i];
    return *this;
  }
  Totals operator-(const Totals& o) const {
    Totals d = *this;
    for (int i = 0; i < kStages; ++i) d.s[i] -= o.s[i], d.calls[i] -= o.calls[i];
    return d;
  }
};

namespace detail {
inline std::atomic<bool> g_on{false};
inline std::array<std::atomic<int64_t>, kStages> g_ns{};     // nanoseconds per stage
inline std::array<std::atomic<int64_t>, kStages> g_calls{};  // timed entries per stage
inline thread_local bool tl_in_stage = false;  // a Scope of this thread is timing
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace detail

inline void set_enabled(bool on) { detail::g_on.store(on, std::memory_order_relaxed); }
inline bool enabled() { return detail::g_on.load(std::memory_order_relaxed); }

inline Totals snapshot() {
  Totals t;
  for (int i = 0; i < kStages; ++i) {
    t.s[i] = 1e-9 * static_cast<double>(detail::g_ns[i].load(std::memory_order_relaxed));
    t.calls[i] = detail::g_calls[i].load(std::memory_order_relaxed);
  }
  return t;
}

// Times its lifetime into one stage when profiling is on and no outer Scope of this
// thread is timing. Atomic adds: the EP layer's side thread (shared experts beside the
// dispatch) may time a stage at the same time.
class Scope {
 public:
  explicit Scope(Stage s) : s_(s), t0_(-1) {
    if (enabled() && !detail::tl_in_stage) {
      detail::tl_in_stage = true;
      t0_ = detail::now_ns();
    }
  }
  ~Scope() {
    if (t0_ < 0) return;
    detail::g_ns[s_].fetch_add(detail::now_ns() - t0_, std::memory_order_relaxed);
    detail::g_calls[s_].fetch_add(1, std::memory_order_relaxed);
    detail::tl_in_stage = false;
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Stage s_;
  int64_t t0_;
};

}  // namespace moe::prof
