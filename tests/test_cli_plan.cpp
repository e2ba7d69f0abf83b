// `moe-ep plan` on a config small enough to count by hand: every byte figure is the sum
// of parameter counts times the dtype size (computed below from the config's numbers,
// not taken from the command's output), and the modelled times follow the printed formula.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace moe {
namespace {

// Qwen3-MoE: H 16, vocab 32, 2 layers (both MoE), 2 heads of 8, 1 KV head, 8 experts of
// I 4, top-2, no shared experts, untied lm_head.
const char* kTinyConfig = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 16, "vocab_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
  "intermediate_size": 24, "moe_intermediate_size": 4, "num_experts": 8, "num_experts_per_tok": 2,
  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
  "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu"
})";

nlohmann::json plan(const std::string& dir, const std::string& flags) {
  std::string out;
  const int rc = test::run_command(std::string(MOE_EP_BINARY) + " plan --json --model " + dir + " " + flags, &out);
  EXPECT_EQ(rc, 0) << out;
  return nlohmann::json::parse(out.substr(out.find('{')));
}

class CliPlan : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(tmp / "config.json") << kTinyConfig; }
  test::TempDir tmp;
  const std::string base = "--nodes 2 --mem-per-node 1 --mem-bw 1 --net-gbps 1 --net-latency-us 10 --context 10";
};

TEST_F(CliPlan, BytesAreParameterCountsTimesDtypeSize) {
  const auto j = plan(tmp.path(), base);
  const auto& p = j["per_node"];
  // embed [32,16] + lm_head [32,16] at bf16 (2 B), final norm [16] in f32.
  EXPECT_EQ(p["embeddings + lm_head + final norm"]["params"], 32 * 16 * 2 + 16);
  EXPECT_EQ(p["embeddings + lm_head + final norm"]["bytes"], 32 * 16 * 2 * 2 + 16 * 4);
  // Per layer: q [16,16], k [8,16], v [8,16], o [16,16] in bf16; q_norm, k_norm [8] and
  // the two layer norms [16] in f32.
  const int linear = 16 * 16 + 8 * 16 + 8 * 16 + 16 * 16, small = 8 + 8 + 16 + 16;
  EXPECT_EQ(p["attention + layer norms"]["params"], 2 * (linear + small));
  EXPECT_EQ(p["attention + layer norms"]["bytes"], 2 * (linear * 2 + small * 4));
  EXPECT_EQ(p["dense MLP layers"]["params"], 0);
  // Router [8,16] f32 per MoE layer.
  EXPECT_EQ(p["router + shared experts"]["bytes"], 2 * 8 * 16 * 4);
  // 4 of 8 experts per node, each gate+up [4,16] and down [16,4], bf16, 2 layers.
  EXPECT_EQ(j["experts_per_node"], 4);
  EXPECT_EQ(p["routed experts (this node's)"]["params"], 2 * 4 * 3 * 16 * 4);
  EXPECT_EQ(p["routed experts (this node's)"]["bytes"], 2 * 4 * 3 * 16 * 4 * 2);
  EXPECT_EQ(j["weight_bytes_per_node"], (32 * 16 * 2 * 2 + 16 * 4) + 2 * (linear * 2 + small * 4) + 2 * 8 * 16 * 4 +
                                            2 * 4 * 3 * 16 * 4 * 2);
  // KV: 2 layers x (K + V) x 1 head x 8 x f32.
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 2 * 1 * 8 * 4);
  EXPECT_TRUE(j["fits"]);

  // Three nodes: 8 experts split 3/3/2; the fullest node holds 3.
  const auto j3 = plan(tmp.path(), "--nodes 3 --mem-per-node 1 --mem-bw 1 --net-gbps 1 --net-latency-us 10");
  EXPECT_EQ(j3["experts_per_node"], 3);
  EXPECT_EQ(j3["per_node"]["routed experts (this node's)"]["bytes"], 2 * 3 * 3 * 16 * 4 * 2);
}

TEST_F(CliPlan, KvCacheDtypeSetsTheKvBytes) {
  // 2 layers x (K + V) x 1 head x 8 values, at 2 bytes (bf16) or 4 (f32, the default).
  const auto j = plan(tmp.path(), base + " --kv-cache-dtype bf16");
  EXPECT_EQ(j["kv_cache_dtype"], "bf16");
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 2 * 1 * 8 * 2);
  EXPECT_EQ(j["kv_bytes_needed"], 2 * 2 * 1 * 8 * 2 * 10);  // --context 10, --batch 1
  EXPECT_EQ(plan(tmp.path(), base)["kv_cache_dtype"], "f32");
}

TEST_F(CliPlan, QuantisedExpertsCountTheirScales) {
  // w8a8: int8 weights + an f32 scale per output channel: gate/up 64 + 4*4, down 64 + 16*4.
  auto j = plan(tmp.path(), base + " --quantize w8a8");
  EXPECT_EQ(j["per_node"]["routed experts (this node's)"]["bytes"], 2 * 4 * (2 * (64 + 16) + (64 + 64)));
  // w4a8, groups of 32 along k: gate/up k = 16 -> 1 group per row of 4; down k = 4 -> 1 per row of 16;
  // 0.5 B per weight + (f32 scale + u8 zero) = 5 B per group.
  j = plan(tmp.path(), base + " --quantize w4a8");
  EXPECT_EQ(j["per_node"]["routed experts (this node's)"]["bytes"], 2 * 4 * (2 * (32 + 5 * 4) + (32 + 5 * 16)));
  // fp8: 1 B per weight + one f32 scale per 128x128 block (one block per matrix here).
  j = plan(tmp.path(), base + " --fp8");
  EXPECT_EQ(j["per_node"]["routed experts (this node's)"]["bytes"], 2 * 4 * 3 * (64 + 4));
}

TEST_F(CliPlan, NetworkAndDecodeFollowTheFormula) {
  const auto j = plan(tmp.path(), base);
  // A token's 2 distinct experts miss the other node's 4 of 8 with P = (4/8)(3/7).
  const double remote = 1 - (4.0 / 8) * (3.0 / 7);
  EXPECT_NEAR(j["remote_nodes_per_token"].get<double>(), remote, 1e-12);
  // Per remote node: 2 int32 expert ids + a bf16 row of 16.
  EXPECT_NEAR(j["dispatch_bytes_per_token_layer"].get<double>(), remote * (2 * 4 + 16 * 2), 1e-9);
  // Combine: f32 rows for the expected 2 * 1/2 remote expert slots.
  EXPECT_NEAR(j["combine_bytes_per_token_layer"].get<double>(), 2 * 0.5 * 16 * 4, 1e-9);
  // Decode step: 2 tokens (one per node); a node's expert is untouched by both with (6/8)^2.
  const double touched = 4 * (1 - 0.75 * 0.75);
  EXPECT_NEAR(j["decode"]["experts_touched_per_node_layer"].get<double>(), touched, 1e-12);
  const double read = 2 * (768 * 2 + 48 * 4)     // attention + norms
                      + 2 * 8 * 16 * 4           // routers
                      + 32 * 16 * 2 + 16 * 2     // lm_head whole, one embedding row
                      + touched * 384 * 2        // experts touched (384 B each), 2 layers
                      + 10 * 128;                // KV of 10 tokens of context
  EXPECT_NEAR(j["decode"]["bytes_read_per_step"].get<double>(), read, 1e-6);
  const double mem_s = read / 1e9;
  // Decode runs alltoall-ll: a record (8-byte head + the bf16 row of 16) per remote
  // slot, k (N-1)/N = 1 of them per token.
  EXPECT_NEAR(j["decode_dispatch_bytes_per_token_layer"].get<double>(), 2 * 0.5 * (8 + 16 * 2), 1e-9);
  const double net_s = 2 * (2 * 10e-6 + (40 + 64) / (1e9 / 8));
  EXPECT_NEAR(j["decode"]["mem_s"].get<double>(), mem_s, 1e-15);
  EXPECT_NEAR(j["decode"]["net_s"].get<double>(), net_s, 1e-15);
  EXPECT_NEAR(j["decode"]["tokens_per_s"].get<double>(), 2 / (mem_s + net_s), 1e-6);
}

// The four layouts' decode steps, by hand on the tiny config at 2 nodes, one
// conversation: attention TP reads its half of q and o, the whole k and v (one KV head,
// held by both ranks), the whole norms and router, half the lm_head and (on the mean)
// half an embedding row; collectives and network per layout_cost's formula.
TEST_F(CliPlan, LayoutsCountWhatEachOneReadsAndSends) {
  const auto j = plan(tmp.path(), base);
  const auto& L = j["layouts"];
  ASSERT_EQ(L.size(), 4u);
  EXPECT_EQ(L[0]["layout"], "dp");
  EXPECT_EQ(L[1]["layout"], "replicated");
  EXPECT_EQ(L[2]["layout"], "moe-tp");
  EXPECT_EQ(L[2]["flags"], "--tp 2");
  EXPECT_EQ(L[3]["layout"], "attn-tp");
  EXPECT_EQ(L[3]["flags"], "--ep 2 --attn-tp 2");
  const double norms = (8 + 8 + 16 + 16) * 4.0, router = 2 * 8 * 16 * 4.0, kv = 2 * 2 * 1 * 8 * 4.0 * 10;
  const double attn_whole = 2 * ((16 * 16 + 8 * 16 + 8 * 16 + 16 * 16) * 2.0 + norms);
  const double attn_half = 2 * ((8 * 16 + 8 * 16 + 8 * 16 + 16 * 8) * 2.0 + norms);
  const double experts = 4 * (1 - 0.75) * (3 * 16 * 4 * 2.0) * 2;  // 4 here, P(hit) 1/4, 2 layers
  const double lm = 32 * 16 * 2.0, row = 16 * 2.0;
  const auto& tp1 = L[3]["one_conversation"];
  EXPECT_NEAR(tp1["bytes_read_per_step"].get<double>(), attn_half + router + lm / 2 + row / 2 + experts + kv, 1e-6);
  EXPECT_NEAR(L[1]["one_conversation"]["bytes_read_per_step"].get<double>(), attn_whole + router + lm + row + experts + kv,
              1e-6);
  EXPECT_EQ(tp1["collectives_per_step"], 2 * 2 + 2);
  EXPECT_EQ(L[1]["one_conversation"]["collectives_per_step"], 2);
  // 6 collectives of one hop at 10 us; 5 all-reduces of a 16-float row (2 x 1/2 of it
  // each: the embedding, and attention and MLP of 2 layers) and, greedy (--top-k 1, the
  // default), one (f32, i32) pair of logits to the other node, over 1 Gbit/s.
  const double link = 1e9 / 8, wire = 5 * (2 * 0.5 * 16 * 4) + 8, net = 6 * 10e-6 + wire / link;
  EXPECT_NEAR(tp1["wire_bytes_per_step"].get<double>(), wire, 1e-9);
  EXPECT_NEAR(tp1["net_s"].get<double>(), net, 1e-12);
  // --top-k 0 (logprobs, penalties): the node's half of the 32 logits instead.
  const auto whole = plan(tmp.path(), base + " --top-k 0");
  EXPECT_NEAR(whole["layouts"][3]["one_conversation"]["wire_bytes_per_step"].get<double>(),
              5 * (2 * 0.5 * 16 * 4) + 0.5 * 32 * 4, 1e-9);
  // Replicated: the slot gather sends this node's half of the 2 k-slot f32 rows, per MoE layer.
  EXPECT_NEAR(L[1]["one_conversation"]["wire_bytes_per_step"].get<double>(), 2 * (0.5 * 2 * 16 * 4), 1e-9);
  // dp, the mean node: half of one token's alltoall-ll records (1 x 40 bytes) and
  // combine (1 f32 row), per MoE layer.
  EXPECT_NEAR(L[0]["one_conversation"]["wire_bytes_per_step"].get<double>(), 2 * 0.5 * (40 + 64), 1e-9);
  // MoE-TP (--tp 2): half the attention as attention TP, every expert's I halved (2 of
  // the 8 experts touched, 384 B each whole), the rest whole; per layer the o_proj
  // all-reduce, per MoE layer three exchanges. The mean node dispatches half a token:
  // k = 2 records of 8 + 32 bytes to the other node, 2 f32 rows back, its output row.
  const auto& mt = L[2]["one_conversation"];
  EXPECT_NEAR(mt["bytes_read_per_step"].get<double>(), attn_half + router + lm + row + 2 * 384 / 2.0 * 2 + kv, 1e-6);
  EXPECT_EQ(mt["collectives_per_step"], 2 + 3 * 2);
  EXPECT_NEAR(mt["wire_bytes_per_step"].get<double>(),
              2 * (2 * 0.5 * 16 * 4) + 2 * 0.5 * (2 * (8 + 32) + 2 * 16 * 4 + 16 * 4), 1e-9);
  EXPECT_NEAR(tp1["tokens_per_s"].get<double>(), 1 / (tp1["bytes_read_per_step"].get<double>() / 1e9 + net), 1e-6);
  // 2 heads do not split 3 ways: no attention-TP layout there, and the fastest is another.
  const auto j3 = plan(tmp.path(), "--nodes 3 --mem-per-node 1 --mem-bw 1 --net-gbps 1 --net-latency-us 10");
  EXPECT_FALSE(j3["layouts"][3]["possible"].get<bool>());
  EXPECT_FALSE(j3["layouts"][2]["possible"].get<bool>());  // nor MoE-TP (heads, and I = 16)
  EXPECT_NE(j3["fastest_for_one_conversation"]["layout"], "attn-tp");
  // Here the network binds (1 Gbit/s, 10 us: attention TP's 5 collectives cost more than
  // the half of the bytes it saves); with a free network the fewest bytes win.
  EXPECT_EQ(j["fastest_for_one_conversation"]["layout"], "replicated");
  const auto fast = plan(tmp.path(), "--nodes 2 --mem-per-node 1 --mem-bw 1 --net-gbps 1000 --net-latency-us 0");
  EXPECT_EQ(fast["fastest_for_one_conversation"]["layout"], "attn-tp");
  EXPECT_NE(fast["fastest_for_one_conversation"]["command"].get<std::string>().find("mpirun -np 2 moe-ep serve"),
            std::string::npos);
}

TEST_F(CliPlan, SaysWhenItDoesNotFitAndRejectsBadInput) {
  // 1e-6 GiB = 1074 bytes, less than the weights.
  const auto j = plan(tmp.path(), "--nodes 2 --mem-per-node 0.000001 --mem-bw 1 --net-gbps 1 --net-latency-us 1");
  EXPECT_FALSE(j["fits"]);
  EXPECT_EQ(j["kv_tokens_that_fit"], 0);
  std::string out;
  EXPECT_NE(test::run_command(std::string(MOE_EP_BINARY) + " plan --model " + tmp.path() +
                                  " --mem-per-node 1 --mem-bw 1 --net-gbps 1 --net-latency-us 1 --fp8 --quantize w8a8",
                              &out),
            0);
  EXPECT_NE(out.find("--fp8 and --quantize w8a8 exclude each other"), std::string::npos) << out;
  EXPECT_NE(test::run_command(std::string(MOE_EP_BINARY) + " plan --model " + tmp.path() + "/missing" +
                                  " --mem-per-node 1 --mem-bw 1 --net-gbps 1 --net-latency-us 1",
                              &out),
            0);
}

// The network model against what the alltoall strategy really sends: `moe-ep bench`
// under mpirun counts the bytes each rank sends per call (random weights and inputs,
// so routing is near uniform, as the plan assumes). 1024 tokens per rank: within 5 %
// (measured: 0.8 % / 1.0 % at 2 ranks, 1.1 % / 1.6 % at 4); a wrong row dtype, a missing
// per-node dedup or a wrong remote fraction would be off by 25 % or more.
TEST(CliPlanNetwork, DispatchAndCombineBytesMatchTheMeasuredOnes) {
  test::TempDir tmp;
  std::ofstream(tmp / "config.json") << R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64, "vocab_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "intermediate_size": 24, "moe_intermediate_size": 32, "num_experts": 16, "num_experts_per_tok": 4,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 64, "tie_word_embeddings": false})";
  for (int np : {2, 4}) {
    SCOPED_TRACE("-np " + std::to_string(np));
    std::string log;
    const std::string json = tmp / "bench.json";
    ASSERT_EQ(test::run_command("OMP_WAIT_POLICY=PASSIVE OMPI_MCA_mpi_yield_when_idle=1 timeout 120 mpirun "
                                "--oversubscribe --allow-run-as-root -np " +
                                    std::to_string(np) + " " + MOE_EP_BINARY +
                                    " bench --shape custom --hidden 64 --inter 32 --experts 16 --topk 4 --tokens 1024 "
                                    "--seconds 0.05 --skip-check --dtype bf16 --moe-comm alltoall --ep " +
                                    std::to_string(np) + " --json " + json,
                                &log),
              0)
        << log;
    std::ifstream in(json);
    const auto measured = nlohmann::json::parse(in)[0];
    const auto j = plan(tmp.path(), "--nodes " + std::to_string(np) +
                                        " --mem-per-node 1 --mem-bw 1 --net-gbps 1 --net-latency-us 1 --dtype bf16");
    const double dispatch = 1024 * j["dispatch_bytes_per_token_layer"].get<double>();
    const double both = dispatch + 1024 * j["combine_bytes_per_token_layer"].get<double>();
    EXPECT_NEAR(measured["dispatch_bytes_per_rank"].get<double>() / dispatch, 1.0, 0.05);
    EXPECT_NEAR(measured["bytes_per_rank"].get<double>() / both, 1.0, 0.05);
  }
}

}  // namespace
}  // namespace moe
