// The files people have under attention TP over the EP group (--ep R --attn-tp R, R = 2
// or 4): GGUF models (split files, MLA with kv_b composed from attn_k_b / attn_v_b, the
// integer-coded types kept in their codes or dequantised on read) and GPTQ / AWQ /
// compressed-tensors int4 checkpoints. Their attention projections, shared experts,
// dense MLPs and lm_head rows are sliced by each format's own reader.
//   * Dequantised at load (int4 off), a model gives the one-rank logits within f32
//     rounding (1e-5 of the largest |logit|; measured 5e-7).
//   * With int4 kept (the default), a row-parallel projection (o_proj, a shared
//     expert's down_proj) quantises its input slice to int8 per rank, so the logits move
//     by the int8 rounding, as on one rank: within the int4 formats' one-rank bound of
//     the dequantised model (worst cosine 1 - 1e-3; test_hf_int4.cpp kInt4Cosine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/communicator.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "../test_model_util.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

std::unique_ptr<Model> load(const std::string& path, int R, bool int4, int attn_tp = -1) {
  ModelOptions o;
  o.n_slots = 2;
  o.max_seq = 16;
  o.gguf_q4_0_as_int4 = int4;
  if (R > 1) {
    o.world = &world();
    o.par = {R, 1, 1, attn_tp < 0 ? R : attn_tp};
  }
  return Model::load(path, o);
}

TEST(FormatsAttnTp, LogitsOfEveryFormat) {
  const int R = world().size();
  if (R != 2 && R != 4) GTEST_SKIP() << "the fixtures' 4 heads split 2 or 4 ways";
  const std::string gguf = test::fixtures_dir() + "/gguf/models/", int4 = test::fixtures_dir() + "/hf_int4/";
  std::vector<std::string> models = {gguf + "qwen2_moe-F32-00001-of-00002.gguf", gguf + "deepseek_v2-F32.gguf",
                                     gguf + "deepseek_v3-BF16.gguf",              gguf + "ernie4_5_moe-F32.gguf",
                                     int4 + "gptq_sym_g32",                       int4 + "gptq_asym_g64",
                                     int4 + "gptq_v2_asym_channel",               int4 + "awq_g32",
                                     int4 + "ct_sym_g32",                         int4 + "ct_asym_channel"};
  if (R == 2) {  // 2 heads
    models.push_back(gguf + "qwen3moe-quant.gguf");
    models.push_back(gguf + "qwen3moe-kquant.gguf");
  }
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6}, {9, 8, 7}};
  for (const std::string& path : models) {
    SCOPED_TRACE(path + " --ep " + std::to_string(R) + " --attn-tp " + std::to_string(R));
    const Tensor want = prefill_logits(*load(path, 1, false), prompts);
    double top = 1;
    for (int64_t i = 0; i < want.numel(); ++i) top = std::max(top, static_cast<double>(std::fabs(want.data<float>()[i])));
    EXPECT_LE(test::max_logit_diff(prefill_logits(*load(path, R, false), prompts), want, prompts), 1e-5 * top);
    const double cosine = test::worst_logit_cosine(prefill_logits(*load(path, R, true), prompts), want, prompts);
    // The K-quant fixture's uniform random codes: its one-rank bound
    // (test_gguf_checkpoint.cpp KQuantModelNearTheF32One).
    EXPECT_GE(cosine, path.ends_with("kquant.gguf") ? 1 - 5e-3 : 1 - 1e-3);
    if (world().rank() == 0)
      std::printf("[ attn-tp formats ] %s, int4 kept: worst logit cosine vs dequantised one rank %.9f\n",
                  path.substr(test::fixtures_dir().size() + 1).c_str(), cosine);
  }
}

// Experts in GGUF's codes (4-bit with offsets, 8-bit with zero points and with offsets)
// under plain EP: each rank holds its experts' codes, and the logits are the one-rank
// model's bit for bit (no TP slice changes what a GEMM quantises).
TEST(FormatsAttnTp, CodedExpertsUnderEpAreBitwise) {
  const int R = world().size();
  if (R != 2 && R != 4) GTEST_SKIP() << "the fixture's 4 experts split 2 or 4 ways";
  const std::string path = test::fixtures_dir() + "/gguf/models/qwen3moe-kquant.gguf";
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6}, {9, 8, 7}};
  const Tensor want = prefill_logits(*load(path, 1, true), prompts), got = prefill_logits(*load(path, R, true, 1), prompts);
  ASSERT_EQ(want.shape(), got.shape());
  EXPECT_EQ(0, std::memcmp(want.raw(), got.raw(), want.nbytes()));
}

}  // namespace
}  // namespace moe
