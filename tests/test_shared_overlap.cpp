// The shared experts really overlap the routed experts' communication: with overlap on,
// SharedRun runs them on the side thread inside the wait for the request (here a request
// that takes 200 ms, as a slow network would), and adds exactly the shared experts'
// output; with overlap off they run after the wait. Timestamps, not speed: the property
// is where the shared experts ran, which does not depend on the machine's load beyond
// the shared MLP of 33 tokens taking less than the 200 ms wait.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "moe/dispatch/common.h"
#include "test_util.h"

namespace moe {
namespace {

class SlowRequest final : public CommRequest {
 public:
  explicit SlowRequest(double s) : s_(s) {}
  void wait() override {
    if (!done_) std::this_thread::sleep_for(std::chrono::duration<double>(s_));
    done_ = true;
  }
  bool test() override { return done_; }

 private:
  double s_;
  bool done_ = false;
};

TEST(SharedOverlap, SharedExpertsRunInsideTheCommunicationWait) {
  const std::string dir = test::fixtures_dir() + "/qwen2_moe";  // has a gated shared expert
  Checkpoint ck = Checkpoint::open(dir);
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  MoeLayer layer(cfg, load_moe_layer(ck, cfg, 1, MlpLoadOptions{}));
  ASSERT_TRUE(layer.weights().shared.has_value());
  const Tensor x = SafetensorsFile::open(dir + "/golden/L1_T33_in.safetensors")->view("hidden_states").clone();
  const int64_t T = x.dim(0), H = cfg.hidden_size;
  Tensor want = Tensor::zeros({T, H}, DType::F32);
  layer.shared_experts(x, want.data<float>(), /*accumulate=*/false);

  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    EpStats st;
    dispatch::SharedRun run;
    SlowRequest req(0.2);
    const double w0 = moe::now_s();
    EpOptions opt;
    opt.overlap = overlap;
    run.start_then_wait(layer, x, opt, st, &req);
    const double w1 = moe::now_s();
    Tensor y = Tensor::zeros({T, H}, DType::F32);
    run.add_to(y.data<float>());
    EXPECT_GE(st.comm_wait_s, 0.2);
    ASSERT_GT(st.shared_end_s, st.shared_begin_s);
    if (overlap) {
      EXPECT_GE(st.shared_begin_s, w0);
      EXPECT_LE(st.shared_end_s, w1) << "the shared experts did not finish inside the 200 ms wait";
    } else {
      EXPECT_GE(st.shared_begin_s, w1) << "without overlap the shared experts run after the wait";
    }
    for (int64_t i = 0; i < T * H; ++i)  // 0 + s == s exactly (== also equates -0 and +0)
      ASSERT_EQ(y.data<float>()[i], want.data<float>()[i]) << "y must be exactly the shared output, element " << i;
  }
  // Under attention TP the shared experts hold a slice and are summed by the caller
  // (EpOptions::shared_partial): the strategies' run adds nothing.
  EpStats st;
  dispatch::SharedRun run;
  EpOptions opt;
  opt.shared_partial = true;
  run.start_then_wait(layer, x, opt, st, nullptr);
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  run.add_to(y.data<float>());
  for (int64_t i = 0; i < T * H; ++i) ASSERT_EQ(y.data<float>()[i], 0.f) << "element " << i;
  EXPECT_EQ(st.shared_s, 0.0);
}

}  // namespace
}  // namespace moe
