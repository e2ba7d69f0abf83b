// The ERNIE-4.5 static W8A8 checkpoint (tests/test_ernie_w8a8_util.h) on every layout
// (mpirun -np 1..4): the same greedy tokens as one rank, and logits bitwise equal to one
// rank under --ep R with alltoall (the int8 kernels are batch-invariant and every rank
// quantises with the same static scales), within f32 summation rounding with allreduce,
// and within the W8A8 test's tolerance (1e-3 of the largest logit) under --tp 2, where
// o_proj's int8 partial products are dequantised and summed per rank.
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "../test_ernie_w8a8_util.h"
#include "../test_model_util.h"

namespace moe {
namespace {

namespace er = test::ernie;

Communicator& world() { return world_comm(true); }

struct Layout {
  int ep, tp, dp;
  MoeComm comm;
};

TEST(ErnieW8A8Ep, EveryLayoutGivesTheSingleRankResult) {
  const int R = world().size();
  test::TempDir dir;  // each rank writes its own copy (the writer is deterministic)
  const er::Model fm = er::float_model();
  test::write_checkpoint(dir.path(), er::kFixture, er::w8a8_tensors(fm, er::calibrate(fm)));
  const std::vector<std::vector<int32_t>> prompts = {{73}, {43, 92, 3, 33, 61}, {30, 40, 51, 95, 92, 28, 50, 44, 76}};
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.ignore_eos = true;
  auto one = test::load_model(dir.path());
  const Tensor ref = prefill_logits(*one, prompts);
  auto one2 = test::load_model(dir.path());
  const auto ref_tokens = generate(*one2, prompts, go).tokens;
  double scale = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, std::fabs(double(ref.data<float>()[i])));
  std::vector<Layout> layouts = {{R, 1, 1, MoeComm::AllToAll}, {R, 1, 1, MoeComm::AllReduce}};
  if (R % 2 == 0) layouts.push_back({R, 1, 2, MoeComm::AllToAll});
  if (R == 4) {
    layouts.push_back({2, 2, 1, MoeComm::Auto});
    layouts.push_back({2, 2, 2, MoeComm::AllToAll});
  }
  for (const Layout& l : layouts) {
    SCOPED_TRACE(fmt::format("--ep {} --tp {} --dp {} --moe-comm {}", l.ep, l.tp, l.dp, moe_comm_name(l.comm)));
    auto make = [&] {
      ModelOptions o;
      o.n_slots = 3;
      o.max_seq = 32;
      o.world = &world();
      o.par = {l.ep, l.tp, l.dp};
      o.ep.comm = l.comm;
      return Model::load(dir.path(), o);
    };
    auto m = make();
    const double d = test::max_logit_diff(prefill_logits(*m, prompts), ref, prompts);
    if (l.tp == 1 && l.comm == MoeComm::AllToAll) EXPECT_EQ(d, 0.0) << "EP invariance";
    else EXPECT_LE(d, 1e-3 * scale);
    auto m2 = make();
    const auto tokens = generate(*m2, prompts, go).tokens;
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(tokens[i], ref_tokens[i]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace moe
