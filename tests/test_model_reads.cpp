// The model's list of reads (model/weights.h) against the fixtures: it names every
// tensor outside the MLP blocks that the checkpoints hold, nothing more; a TP rank
// reads only its slice of the attention, exactly as listed; and `moe-ep inspect`
// plans exactly the bytes a rank's load reads, for --ep and --tp layouts.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>

#include "loader/checkpoint.h"
#include "loader/inventory.h"
#include "loader/moe_weights.h"
#include "model/attention.h"
#include "model/registry.h"
#include "model/weights.h"
#include "test_util.h"

namespace moe {
namespace {

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  for (const auto& f : test::manifest()) out.push_back(test::fixtures_dir() + "/" + f["name"].get<std::string>());
  return out;
}

// Bytes of the block scales an FP8 weight's read brings along (loader/shard.h
// fp8_scale_read: the whole scale tensor, or a stacked tensor's rows of its experts);
// 0 for a float tensor.
uint64_t scale_bytes(const Checkpoint& ck, const TensorRead& r) {
  const std::string skey = r.key + "_scale_inv";
  if (ck.info(r.key).dtype != DType::F8E4M3 || !ck.has(skey)) return 0;
  const TensorInfo& si = ck.info(skey);
  return plan_shard(fp8_scale_read(r, si.shape)).bytes_read(dtype_size(si.dtype));
}

// The model's reads plus every layer's MLP reads (all experts) cover each key of a
// clean fixture exactly once (an FP8 weight's read covers its "_scale_inv" too), and
// the checker finds nothing wrong.
TEST(ModelReads, ListEveryFixtureKeyExactlyOnce) {
  for (const std::string& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    const Checkpoint ck = Checkpoint::open(dir);
    const ModelConfig c = model_config_from_hf(ck.config());
    const std::vector<TensorRead> non_mlp = model_reads(c, 0, 1);
    std::multiset<std::string> listed;
    auto list = [&](const TensorRead& r) {
      listed.insert(r.key);
      if (scale_bytes(ck, r) > 0) listed.insert(r.key + "_scale_inv");
    };
    for (const TensorRead& r : non_mlp) {
      list(r);
      ASSERT_TRUE(ck.has(r.key)) << r.key;
      EXPECT_EQ(ck.info(r.key).shape, r.shape) << r.key;
    }
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (const LayerRead& r : mlp_layer_reads(ck, c.moe, l, {})) list(r.tensor_read());
    const std::vector<std::string> keys = ck.keys();
    EXPECT_EQ(listed, std::multiset<std::string>(keys.begin(), keys.end()));
    const auto problems = check_checkpoint(ck, c.moe, non_mlp);
    for (const auto& p : problems) ADD_FAILURE() << p.message;
  }
}

// Under --tp 2 each rank reads half of every column-/row-parallel attention tensor and
// the whole of the replicated ones (norms, MLA's kv_a); the row-parallel bias only on
// rank 0; an FP8 weight's block scales whole on both. Building the attention module
// reads exactly the listed bytes, nothing else.
TEST(ModelReads, TpRankReadsOnlyItsSliceOfTheAttention) {
  for (const std::string& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    const Checkpoint info_ck = Checkpoint::open(dir);
    const ModelConfig c = model_config_from_hf(info_ck.config());
    const AttentionKeys keys = find_family(c.model_type).attention_keys(c, 0);
    std::map<std::string, uint64_t> summed;  // bytes over both ranks, per key
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(r);
      const AttentionReads rd = attention_reads(c, keys, r, 2);
      uint64_t listed = 0;
      for (const TensorRead& t : rd.all()) {
        const uint64_t full = info_ck.info(t.key).nbytes, all = read_bytes(info_ck, t);
        const uint64_t got = all - scale_bytes(info_ck, t);  // the codes' (or floats') share
        listed += all;
        summed[t.key] += got;
        switch (t.rule.kind) {
          case ShardKind::Replicated: EXPECT_EQ(got, full) << t.key; break;
          case ShardKind::RowBias: EXPECT_EQ(got, r == 0 ? full : 0) << t.key; break;
          default: EXPECT_EQ(got, full / 2) << t.key; break;
        }
      }
      const Checkpoint ck = Checkpoint::open(dir);
      if (c.attention == AttentionKind::Mla)
        MlaAttention(ck, c, keys, DType::F32, r, 2);
      else
        GqaAttention(ck, c, keys, DType::F32, r, 2);
      EXPECT_EQ(ck.bytes_touched(), listed);
    }
    // Between them the two ranks read every sliced byte once.
    for (const auto& [key, bytes] : summed) {
      const uint64_t full = info_ck.info(key).nbytes;
      EXPECT_TRUE(bytes == full || bytes == 2 * full) << key << ": " << bytes << " of " << full;
    }
  }
}

// The block scales of EP rank `ep_rank`'s experts (FP8 fixtures; else 0): both ranks of
// a MoE-TP pair read them whole, next to their half of the codes.
uint64_t expert_scale_bytes(const std::string& dir, int ep_rank, int ep) {
  const Checkpoint ck = Checkpoint::open(dir);
  const ModelConfig c = model_config_from_hf(ck.config());
  MlpLoadOptions opt;
  opt.expert_begin = ep_rank * c.moe.n_experts / ep;
  opt.expert_end = (ep_rank + 1) * c.moe.n_experts / ep;
  uint64_t n = 0;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const LayerRead& r : mlp_layer_reads(ck, c.moe, l, opt))
      if (r.role == LayerRead::ExpertGate || r.role == LayerRead::ExpertUp || r.role == LayerRead::ExpertDown ||
          r.role == LayerRead::FusedGateUp || r.role == LayerRead::FusedDown)
        n += scale_bytes(ck, r.tensor_read());
  return n;
}

// `inspect --load --all-ranks` loads each rank's share as the model does: the bytes it
// reads equal the plan on every rank, for EP, TP and both; a TP pair of ranks splits its
// EP rank's expert bytes exactly in two (MoE-TP reads only the I slice of each expert;
// FP8 block scales, a few bytes per block, both read whole).
TEST(ModelReads, InspectPlanIsWhatEachRankReads) {
  for (const std::string& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    std::map<std::pair<int, int>, nlohmann::json> runs;
    for (const auto& [ep, tp] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
      test::TempDir d;
      std::string log;
      // Packed as the model loads (load_moe_layer), and once the I/O path alone.
      const char* no_pack = ep * tp == 4 ? " --no-pack" : "";
      const int rc = test::run_command(fmt::format("{} inspect --model {} --ep {} --tp {} --load --all-ranks{} --json {}",
                                                   MOE_EP_BINARY, dir, ep, tp, no_pack, d / "r.json"),
                                       &log);
      ASSERT_EQ(rc, 0) << log;
      EXPECT_NE(log.find("problems: none"), std::string::npos) << log;
      std::ifstream in(d / "r.json");
      const nlohmann::json j = nlohmann::json::parse(in);
      ASSERT_EQ(j["loads"].size(), static_cast<size_t>(ep * tp));
      for (const auto& l : j["loads"]) EXPECT_EQ(l["bytes_read"], l["planned_bytes"]) << l.dump();
      runs[{ep, tp}] = j;
    }
    // --attn-tp 2: each rank reads half the attention, shared experts, dense MLPs and
    // lm_head, and the same routed experts as --ep 2.
    test::TempDir d;
    std::string log;
    const ModelConfig c = model_config_from_hf(Checkpoint::open(dir).config());
    if (c.n_heads % 2 == 0) {
      ASSERT_EQ(test::run_command(fmt::format("{} inspect --model {} --attn-tp 2 --load --all-ranks --json {}",
                                              MOE_EP_BINARY, dir, d / "a.json"),
                                  &log),
                0)
          << log;
      EXPECT_NE(log.find("read plan for --ep 2 --attn-tp 2"), std::string::npos) << log;
      std::ifstream in(d / "a.json");
      const nlohmann::json j = nlohmann::json::parse(in);
      ASSERT_EQ(j["loads"].size(), 2u);
      for (const auto& l : j["loads"]) EXPECT_EQ(l["bytes_read"], l["planned_bytes"]) << l.dump();
      const auto& ep2 = runs[std::make_pair(2, 1)]["ranks"];
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(j["ranks"][r]["expert_bytes"], ep2[r]["expert_bytes"]);
        EXPECT_LT(j["ranks"][r]["non_expert_bytes"].get<uint64_t>(), ep2[r]["non_expert_bytes"].get<uint64_t>());
      }
    }
    for (int ep : {1, 2}) {
      const auto& one = runs[{ep, 1}]["ranks"];
      const auto& two = runs[{ep, 2}]["ranks"];
      for (int e = 0; e < ep; ++e)
        EXPECT_EQ(two[2 * e]["expert_bytes"].get<uint64_t>() + two[2 * e + 1]["expert_bytes"].get<uint64_t>(),
                  one[e]["expert_bytes"].get<uint64_t>() + expert_scale_bytes(dir, e, ep));
      // TP halves the sliced attention: a TP rank reads less outside the experts.
      EXPECT_LT(two[0]["non_expert_bytes"].get<uint64_t>(), one[0]["non_expert_bytes"].get<uint64_t>());
    }
  }
}

}  // namespace
}  // namespace moe
