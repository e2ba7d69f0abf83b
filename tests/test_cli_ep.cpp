// `moe-ep layer` under mpirun: the contract of the single-rank verb holds for every
// strategy and layout, and bad layouts are clear errors on every rank.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "loader/safetensors.h"
#include "test_util.h"

namespace moe {
namespace {

// Environment for mpirun as root on a small machine (CI runs as root on 2 cores).
const std::string kMpirun =
    "OMP_WAIT_POLICY=PASSIVE OMPI_MCA_mpi_yield_when_idle=1 timeout 120 mpirun --oversubscribe --allow-run-as-root ";

std::string fixture(const std::string& name) { return test::fixtures_dir() + "/" + name; }

std::string layer_cmd(const std::string& model, int layer, const std::string& in, const std::string& out,
                      const std::string& extra) {
  return std::string(MOE_EP_BINARY) + " layer --quiet --model " + model + " --layer " + std::to_string(layer) +
         " --input " + in + " --output " + out + " " + extra;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

Tensor read_y(const std::string& path) { return SafetensorsFile::open(path)->view("hidden_states").clone(); }

struct EpRun {
  int np;
  std::string flags;
  bool bitwise;  // alltoall family with tp = 1: identical bytes to the single-rank output
};

TEST(CliEp, EveryLayoutWritesTheSingleRankOutput) {
  test::TempDir tmp;
  const std::vector<EpRun> runs = {
      {2, "--ep 2 --moe-comm alltoall", true},
      {2, "--ep 2 --moe-comm alltoall-ll --max-tokens-per-rank 32", true},
      {3, "--ep 3 --moe-comm alltoall --moe-chunk-tokens 4", true},
      {2, "--ep 2 --moe-comm allreduce", false},
      {2, "--ep 2 --moe-comm allgather --dp 2 --dp-tokens 0,33", false},
      {4, "--ep 2 --tp 2 --moe-comm alltoall", false},
      {4, "--ep 4 --dp 4 --dp-tokens 5,0,28,0 --moe-comm auto", true},
  };
  for (const std::string& name : {std::string("deepseek_v3"), std::string("qwen2_moe")}) {
    const std::string model = fixture(name), in = model + "/golden/L1_T33_in.safetensors";
    std::string log;
    ASSERT_EQ(test::run_command(layer_cmd(model, 1, in, tmp / "single.safetensors", ""), &log), 0) << log;
    const std::string single = read_file(tmp / "single.safetensors");
    for (const EpRun& r : runs) {
      SCOPED_TRACE(name + ": -np " + std::to_string(r.np) + " " + r.flags);
      const std::string out = tmp / "ep.safetensors";
      const int rc = test::run_command(kMpirun + "-np " + std::to_string(r.np) + " " +
                                           layer_cmd(model, 1, in, out, r.flags + " --dtype f32"),
                                       &log);
      ASSERT_EQ(rc, 0) << log;
      if (r.bitwise) {
        EXPECT_EQ(read_file(out), single) << "the output is not bitwise identical to one rank";
      } else {
        EXPECT_TRUE(test::all_close(read_y(out), read_y(tmp / "single.safetensors"), {1e-5, 1e-5}));
      }
    }
  }
}

TEST(CliEp, RanksThatDisagreeStopWithAMessage) {
  test::TempDir tmp;
  const std::string model = fixture("mixtral"), in = model + "/golden/L1_T7_in.safetensors";
  std::string log;
  // Two ranks started with different flags (MPMD): every rank names the field.
  const int rc = test::run_command(kMpirun + "-np 1 " + layer_cmd(model, 1, in, tmp / "y.safetensors", "--ep 2") +
                                       " : -np 1 " +
                                       layer_cmd(model, 1, in, tmp / "y.safetensors", "--ep 2 --moe-chunk-tokens 4"),
                                   &log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("ranks disagree on 'flags'"), std::string::npos) << log;
  EXPECT_NE(log.find("--moe-chunk-tokens 4"), std::string::npos) << log;
}

TEST(CliEp, BadLayoutsAreClearErrors) {
  test::TempDir tmp;
  const std::string model = fixture("mixtral"), in = model + "/golden/L1_T7_in.safetensors";
  std::string log;
  EXPECT_EQ(test::run_command(layer_cmd(model, 1, in, tmp / "y.safetensors", "--ep 2"), &log), 1);
  EXPECT_NE(log.find("mpirun -np 2"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 2 " + layer_cmd(model, 1, in, tmp / "y.safetensors", "--ep 4"), &log), 0);
  EXPECT_NE(log.find("--ep 4 --tp 1 needs 4 ranks"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 2 " + layer_cmd(model, 1, in, tmp / "y.safetensors",
                                                             "--ep 2 --moe-comm allreduce --dp 2"),
                              &log),
            0);
  EXPECT_NE(log.find("allreduce needs every rank to hold the same tokens"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 2 " + layer_cmd(model, 1, in, tmp / "y.safetensors",
                                                             "--ep 2 --dp 2 --dp-tokens 3,3"),
                              &log),
            0);
  EXPECT_NE(log.find("--dp-tokens sums to 6, but the input has 7 tokens"), std::string::npos) << log;
  // mixtral's I = 24 does not split 5 ways... use a TP that does not divide I.
  test::TempDir t2;
  const std::string m2 = fixture("qwen2_moe"), in2 = m2 + "/golden/L1_T7_in.safetensors";
  EXPECT_NE(test::run_command(kMpirun + "-np 3 " + layer_cmd(m2, 1, in2, t2 / "y.safetensors", "--ep 1 --tp 3"), &log),
            0);
  EXPECT_NE(log.find("--tp 3 does not divide"), std::string::npos) << log;
}

// The EPLB path a user takes: the load of a run, `moe-ep eplb`, then the placement file
// (or redundant slots) under mpirun: the all-to-all output stays bitwise one rank's.
TEST(CliEplb, LoadFilePlacementFileAndRedundantSlots) {
  test::TempDir tmp;
  const std::string model = fixture("deepseek_v3"), in = model + "/golden/L1_T33_in.safetensors";
  const std::string ep = std::string(MOE_EP_BINARY);
  std::string log;
  ASSERT_EQ(test::run_command(layer_cmd(model, 1, in, tmp / "single.safetensors", ""), &log), 0) << log;
  const std::string single = read_file(tmp / "single.safetensors");
  ASSERT_EQ(test::run_command(ep + " generate --quiet --model " + model +
                                  " --prompt-ids '1,2,3,4,5,6,7,8;9,10,11' --max-new-tokens 6 --ignore-eos "
                                  "--expert-load-out " + (tmp / "load.json"),
                              &log),
            0)
      << log;
  ASSERT_EQ(test::run_command(ep + " eplb --load " + (tmp / "load.json") +
                                  " --ep 2 --redundant-experts 2 --output " + (tmp / "pl.json"),
                              &log),
            0)
      << log;
  EXPECT_NE(log.find("global policy"), std::string::npos) << log;
  for (const std::string& flags : {"--moe-comm alltoall --placement " + (tmp / "pl.json"),
                                  std::string("--moe-comm alltoall-ll --redundant-experts 4")}) {
    SCOPED_TRACE(flags);
    const std::string out = tmp / "ep.safetensors";
    ASSERT_EQ(test::run_command(kMpirun + "-np 2 " + layer_cmd(model, 1, in, out, "--ep 2 --dtype f32 " + flags), &log),
              0)
        << log;
    EXPECT_EQ(read_file(out), single) << "the output is not bitwise identical to one rank";
  }
  // Bad input: slots that do not divide, a file for another layout, one rank, a bad load file.
  EXPECT_NE(test::run_command(kMpirun + "-np 2 " +
                                  layer_cmd(model, 1, in, tmp / "y.safetensors", "--ep 2 --redundant-experts 1"),
                              &log),
            0);
  EXPECT_NE(log.find("do not divide over 2 EP ranks"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 4 " + layer_cmd(model, 1, in, tmp / "y.safetensors",
                                                             "--ep 4 --placement " + (tmp / "pl.json")),
                              &log),
            0);
  EXPECT_NE(log.find("is for 32 experts over ep 2"), std::string::npos) << log;
  EXPECT_NE(test::run_command(layer_cmd(model, 1, in, tmp / "y.safetensors", "--placement " + (tmp / "pl.json")), &log),
            0);
  EXPECT_NE(log.find("need --ep > 1"), std::string::npos) << log;
  {
    std::ofstream bad(tmp / "bad.json");
    bad << R"({"format": "moe-ep expert load v1", "experts": 4, "window": 1, "steps": 1, "layers": [1], "load": [[1, 2]]})";
  }
  EXPECT_NE(test::run_command(ep + " eplb --load " + (tmp / "bad.json") + " --ep 2 --output " + (tmp / "x.json"), &log),
            0);
  EXPECT_NE(log.find("load of layer 1 has 2 entries, expected 4"), std::string::npos) << log;
  EXPECT_FALSE(std::ifstream(tmp / "x.json").good()) << "a failed run must not leave an output file";
}

// On one rank: --moe-chunk-tokens runs the layer in chunks (same bits), and the flags
// that only steer communication say once that they do nothing.
TEST(CliEp, OneRankAppliesChunkingAndNamesTheIdleFlags) {
  test::TempDir tmp;
  const std::string model = fixture("deepseek_v3"), in = model + "/golden/L1_T33_in.safetensors";
  std::string log;
  ASSERT_EQ(test::run_command(layer_cmd(model, 1, in, tmp / "whole.safetensors", ""), &log), 0) << log;
  const std::string chunked_cmd = std::string(MOE_EP_BINARY) + " layer --model " + model + " --layer 1 --input " + in +
                                  " --output " + (tmp / "chunked.safetensors") + " --moe-chunk-tokens 4";
  ASSERT_EQ(test::run_command(chunked_cmd, &log), 0) << log;
  EXPECT_NE(log.find("1 rank, 9 chunks of <= 4 tokens"), std::string::npos) << log;  // 33 rows: 8 x 4 + 1
  EXPECT_EQ(read_file(tmp / "chunked.safetensors"), read_file(tmp / "whole.safetensors"));
  EXPECT_EQ(log.find("do nothing on one rank"), std::string::npos) << log;

  ASSERT_EQ(test::run_command(layer_cmd(model, 1, in, tmp / "y.safetensors",
                                        "--moe-comm alltoall --no-overlap --max-tokens-per-rank 8"),
                              &log),
            0)
      << log;
  EXPECT_NE(log.find("moe-ep: note: --moe-comm alltoall --max-tokens-per-rank 8 --no-overlap do nothing on one rank"),
            std::string::npos)
      << log;

  // The whole model: chunked MoE calls give the same logits bit for bit.
  const std::string fwd = std::string(MOE_EP_BINARY) + " forward --quiet --model " + model +
                          " --prompt-ids '1,2,3,4,5,6,7;8,9' --logits ";
  ASSERT_EQ(test::run_command(fwd + (tmp / "l1.safetensors"), &log), 0) << log;
  ASSERT_EQ(test::run_command(fwd + (tmp / "l2.safetensors") + " --moe-chunk-tokens 2", &log), 0) << log;
  EXPECT_EQ(read_file(tmp / "l1.safetensors"), read_file(tmp / "l2.safetensors"));
}

// The layout of the seed as a user types it: `--attn-tp N` alone under mpirun -np N (the
// experts EP over the same ranks); vLLM's spelling and layouts that do not fit are errors
// that say what to type or which numbers clash.
TEST(CliEp, AttentionTpAsAUserTypesIt) {
  const std::string model = fixture("deepseek_v3");  // 4 heads
  const std::string gen = std::string(MOE_EP_BINARY) + " generate --model " + model +
                          " --prompt-ids '1,2,3,4;5,6' --max-new-tokens 6 --ignore-eos ";
  std::string one, log;
  ASSERT_EQ(test::run_command(gen, &one), 0) << one;
  const std::string tokens = one.substr(0, one.find("moe-ep generate:"));
  ASSERT_NE(tokens.find("prompt 1: "), std::string::npos) << one;
  ASSERT_EQ(test::run_command(kMpirun + "-np 4 " + gen + "--attn-tp 4", &log), 0) << log;
  EXPECT_EQ(log.substr(0, log.find("moe-ep generate:")), tokens) << log;
  EXPECT_NE(log.find("(--ep 4 --tp 1 --dp 1 --attn-tp 4)"), std::string::npos) << log;
  ASSERT_EQ(test::run_command(kMpirun + "-np 4 " + gen + "--attn-tp 2 --dp 2 --moe-comm alltoall", &log), 0) << log;
  EXPECT_EQ(log.substr(0, log.find("moe-ep generate:")), tokens) << log;

  EXPECT_NE(test::run_command(kMpirun + "-np 2 " + gen + "--tp 2 --enable-expert-parallel", &log), 0);
  EXPECT_NE(log.find("--ep N --attn-tp N"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 3 " + gen + "--attn-tp 3", &log), 0);
  EXPECT_NE(log.find("--attn-tp 3 does not divide the model's 4 attention heads"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 4 " + gen + "--attn-tp 2 --tp 2 --ep 2", &log), 0);
  EXPECT_NE(log.find("--attn-tp 2 with --tp 2"), std::string::npos) << log;
  EXPECT_NE(test::run_command(kMpirun + "-np 4 " + gen + "--attn-tp 2 --ep 4", &log), 0);
  EXPECT_NE(log.find("--attn-tp 2 must equal the ranks of one DP replica, 4"), std::string::npos) << log;
  EXPECT_NE(test::run_command(gen + "--attn-tp 2", &log), 0);
  EXPECT_NE(log.find("needs 2 ranks: start it as mpirun -np 2"), std::string::npos) << log;
}

// bench-model on a checkpoint (--model): the byte count of a decode step follows the
// layout. Under --attn-tp 2 rank 0 reads half the vocabulary's lm_head rows and less
// attention than under --ep 2 (replicated), the same experts' bytes per expert touched;
// the model check (batch invariance, KV decode = prefill) passes on both.
TEST(CliEp, BenchModelOnACheckpointCountsWhatEachLayoutReads) {
  const std::string model = fixture("deepseek_v3");  // MLA, a dense layer, shared experts
  test::TempDir tmp;
  const std::string bm = std::string(MOE_EP_BINARY) + " bench-model --model " + model +
                         " --prefill 4 --decode-batch 1 --decode-context 8 --decode-steps 2 --repeats 1 --dtype f32";
  std::map<std::string, nlohmann::json> runs;
  for (const std::string layout : {"--ep 2", "--ep 2 --attn-tp 2"}) {
    std::string log;
    ASSERT_EQ(test::run_command(kMpirun + "-np 2 " + bm + " " + layout + " --json " + (tmp / "b.json"), &log),
              0)
        << log;
    EXPECT_NE(log.find("check: model: ok"), std::string::npos) << log;
    EXPECT_NE(log.find("skipped (--model: the checkpoint's experts)"), std::string::npos) << log;
    std::ifstream in(tmp / "b.json");
    runs[layout] = nlohmann::json::parse(in)["decode"][0];
  }
  const nlohmann::json& rep = runs["--ep 2"]["rank0_bytes"];
  const nlohmann::json& atp = runs["--ep 2 --attn-tp 2"]["rank0_bytes"];
  // 128 x 32 f32 lm_head (rows 0..63 under --attn-tp 2), its f32 final norm, one f32
  // embedding row per token (under --attn-tp 2 read by one of the two ranks: half a row
  // on the mean).
  EXPECT_DOUBLE_EQ(rep["lm_head_embed"].get<double>(), 128 * 32 * 4 + 32 * 4 + 32 * 4);
  EXPECT_DOUBLE_EQ(atp["lm_head_embed"].get<double>(), 64 * 32 * 4 + 32 * 4 + 16 * 4);
  EXPECT_LT(atp["attention"].get<double>(), rep["attention"].get<double>());
  EXPECT_GT(atp["attention"].get<double>(), 0.4 * rep["attention"].get<double>());
}

}  // namespace
}  // namespace moe
