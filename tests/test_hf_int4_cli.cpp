// `moe-ep forward` on GPTQ / compressed-tensors int4 directories (loader/hf_int4/hf_int4.h):
// one rank writes the API's logits, and under mpirun --ep 2 (each rank loading only its
// experts' int4 tensors; alltoall, EP-invariant) the same bytes again. Kept out of the
// loader suites' binary: it runs mpirun.
#include <gtest/gtest.h>

#include <cstring>

#include "loader/safetensors.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_util.h"

namespace moe {
namespace {

const std::string kMpirun =
    "OMP_WAIT_POLICY=PASSIVE OMPI_MCA_mpi_yield_when_idle=1 timeout 120 mpirun --oversubscribe --allow-run-as-root ";

TEST(HfInt4Cli, ForwardMatchesTheApiOnOneRankAndUnderEp) {
  test::TempDir tmp;
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4}, {1, 5, 9, 2, 6, 5, 3}};
  for (const std::string name : {"gptq_asym_g64", "ct_asym_channel"}) {
    SCOPED_TRACE(name);
    const std::string dir = test::fixtures_dir() + "/hf_int4/" + name;
    const std::string base = std::string(MOE_EP_BINARY) + " forward --quiet --model " + dir +
                             " --prompt-ids '3,1,4;1,5,9,2,6,5,3' --dtype f32 ";
    std::string log;
    ASSERT_EQ(test::run_command(base + "--logits " + (tmp / "one.safetensors"), &log), 0) << log;
    ModelOptions o;
    o.dtype = DType::F32;
    o.n_slots = 2;
    o.max_seq = 16;
    const Tensor want = prefill_logits(*Model::load(dir, o), prompts);
    const Tensor got = SafetensorsFile::open(tmp / "one.safetensors")->view("logits").clone();
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
    const std::string out = tmp / "ep.safetensors";
    ASSERT_EQ(test::run_command(kMpirun + "-np 2 " + base + "--ep 2 --moe-comm alltoall --logits " + out, &log), 0)
        << log;
    const Tensor ep = SafetensorsFile::open(out)->view("logits").clone();
    ASSERT_EQ(ep.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(ep.raw(), want.raw(), want.nbytes())) << "--ep 2 --moe-comm alltoall";
  }
}

}  // namespace
}  // namespace moe
