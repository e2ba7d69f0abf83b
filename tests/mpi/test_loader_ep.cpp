// Sharded loading across real ranks: with --ep R (and --ep R/2 --tp 2 when R is even)
// each rank reads its experts' byte ranges (under MoE-TP only its I slice of each),
// its TP slice of the attention, the replicated tensors and nothing else (bytes read
// <= the rank's non-expert bytes + E_l/E of the expert bytes / tp + headers, and
// exactly what `inspect` plans), on every fixture and on a generated larger
// checkpoint that mixes both expert layouts over two shards; and a fused checkpoint
// sliced by rows gives the same EP layer output, bit for bit, as its per-expert twin.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "comm/communicator.h"
#include "loader/checkpoint.h"
#include "loader/inventory.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "model/registry.h"
#include "model/weights.h"
#include "moe/ep_layer.h"
#include "moe/placement.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
Communicator& world() { return world_comm(true); }

struct Bytes {
  uint64_t read = 0, bound = 0, planned = 0;
};

// Loads this rank's share of the whole model for --ep ep --tp tp [--attn-tp ep] as the
// model does (loader/inventory.h load_share) on a fresh Checkpoint; returns the bytes
// read, the bound and the plan.
Bytes load_rank_share(const std::string& dir, int ep, int tp, int attn_tp = 1) {
  const int rank = world().rank(), ep_rank = rank / tp, tp_rank = rank % tp;
  Checkpoint ck = Checkpoint::open(dir);
  const ModelConfig c = model_config_from_hf(ck.config());
  const MoeConfig& cfg = c.moe;
  const Placement pl = Placement::contiguous(cfg.n_experts, ep, tp);
  MlpLoadOptions o;
  o.expert_begin = pl.begin(ep_rank);
  o.expert_end = pl.end(ep_rank);
  o.tp_rank = tp_rank;
  o.tp_size = tp;
  o.mlp_tp_rank = attn_tp > 1 ? rank : 0;
  o.mlp_tp_size = attn_tp;
  const std::vector<TensorRead> non_mlp =
      attn_tp > 1 ? model_reads(c, rank, attn_tp, /*vocab_parallel=*/true) : model_reads(c, tp_rank, tp);
  load_share(ck, cfg, non_mlp, o, /*pack=*/true);
  Bytes b;
  b.read = ck.bytes_touched() + ck.header_bytes_opened();
  Checkpoint fresh = Checkpoint::open(dir);
  const Inventory inv = take_inventory(fresh);
  const uint64_t experts = inv.kinds.count(TensorKind::Experts) ? inv.kinds.at(TensorKind::Experts).bytes : 0;
  // Non-expert: what this TP rank reads outside the MLP blocks plus the MLP blocks'
  // replicated tensors (routers, shared experts, dense MLPs).
  uint64_t non_expert = 0;
  for (const TensorRead& r : non_mlp) non_expert += read_bytes(fresh, r);
  for (const auto& [kind, t] : inv.kinds)
    if (kind == TensorKind::Router || kind == TensorKind::SharedExperts || kind == TensorKind::DenseMlp)
      non_expert += t.bytes;
  // FP8 experts: each MoE-TP rank reads its experts' block scales whole (loader/shard.h
  // fp8_scale_read; a few bytes per 128 x 128 block) beside its share of the codes.
  uint64_t scales = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    for (const LayerRead& r : mlp_layer_reads(fresh, cfg, l, o)) {
      const std::string skey = r.key + "_scale_inv";
      if (r.role == LayerRead::Router || r.role == LayerRead::Bias || r.role == LayerRead::Shared ||
          r.role == LayerRead::SharedGate || r.role == LayerRead::Dense || !fresh.has(skey))
        continue;
      const TensorInfo& si = fresh.info(skey);
      scales += plan_shard(fp8_scale_read(r.tensor_read(), si.shape)).bytes_read(dtype_size(si.dtype));
    }
  b.bound = non_expert + experts * static_cast<uint64_t>(pl.n_local(ep_rank)) / cfg.n_experts / tp + scales +
            inv.header_bytes;
  b.planned = read_plan(
                  fresh, cfg, inv, ep, tp, DType::F32,
                  [&](int t, int n) { return model_reads(c, t, n, /*vocab_parallel=*/attn_tp > 1); }, attn_tp)[rank]
                  .read_bytes();
  return b;
}

// The layouts of R ranks: --ep R, --ep R/2 --tp 2 when R is even, and --ep R --attn-tp R.
struct LoadLayout {
  int ep, tp, attn_tp;
};
std::vector<LoadLayout> layouts() {
  const int R = world().size();
  std::vector<LoadLayout> out = {{R, 1, 1}};
  if (R % 2 == 0) out.push_back({R / 2, 2, 1});
  if (R > 1) out.push_back({R, 1, R});
  return out;
}

TEST(LoaderEp, EachRankReadsOnlyItsExpertsOnEveryFixture) {
  std::ifstream in(std::string(MOE_FIXTURES_DIR) + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  for (const auto& f : m) {
    const std::string dir = std::string(MOE_FIXTURES_DIR) + "/" + f["name"].get<std::string>();
    for (const auto& [ep, tp, attn_tp] : layouts()) {
      if (f["n_experts"].get<int>() < ep) continue;
      if (attn_tp > 1) {
        const ModelConfig c = model_config_from_hf(Checkpoint::open(dir).config());
        const bool fits = c.n_heads % attn_tp == 0 &&
                          (c.attention == AttentionKind::Mla || c.n_kv_heads % attn_tp == 0 || attn_tp % c.n_kv_heads == 0);
        if (!fits) continue;
      }
      SCOPED_TRACE(fmt::format("{} --ep {} --tp {} --attn-tp {}", dir, ep, tp, attn_tp));
      const Bytes b = load_rank_share(dir, ep, tp, attn_tp);
      EXPECT_LE(b.read, b.bound);
      EXPECT_EQ(b.read, b.planned);  // `inspect` predicts exactly what the loader reads
    }
  }
}

// A qwen3_moe checkpoint of 4 MoE layers, E = 16, bf16, over 2 shards with an index:
// layers 0 and 1 per-expert, layers 2 and 3 stacked (fused). 4 attention heads of 64.
void write_generated(const std::string& dir) {
  const int64_t H = 256, I = 128, E = 16, L = 4, V = 512, heads = 4, hd = H / heads;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 0.05f);
  auto rnd = [&](const Shape& s, DType dt) {
    Tensor t = Tensor::empty(s, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
    return t.to(dt);
  };
  std::vector<std::pair<std::string, Tensor>> shard[2];
  nlohmann::json wm = nlohmann::json::object();
  auto add = [&](int s, const std::string& k, Tensor t) {
    shard[s].emplace_back(k, std::move(t));
    wm[k] = fmt::format("model-0000{}-of-00002.safetensors", s + 1);
  };
  add(0, "model.embed_tokens.weight", rnd({V, H}, DType::BF16));
  add(1, "lm_head.weight", rnd({V, H}, DType::BF16));
  add(1, "model.norm.weight", rnd({H}, DType::BF16));
  for (int64_t l = 0; l < L; ++l) {
    const int s = l < 2 ? 0 : 1;
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* a : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(s, p + "self_attn." + a + ".weight", rnd({H, H}, DType::BF16));
    for (const char* n : {"q_norm", "k_norm"}) add(s, p + "self_attn." + n + ".weight", rnd({hd}, DType::BF16));
    add(s, p + "input_layernorm.weight", rnd({H}, DType::BF16));
    add(s, p + "post_attention_layernorm.weight", rnd({H}, DType::BF16));
    add(s, p + "mlp.gate.weight", rnd({E, H}, DType::BF16));
    if (l < 2) {
      for (int64_t e = 0; e < E; ++e) {
        const std::string q = p + fmt::format("mlp.experts.{}.", e);
        add(s, q + "gate_proj.weight", rnd({I, H}, DType::BF16));
        add(s, q + "up_proj.weight", rnd({I, H}, DType::BF16));
        add(s, q + "down_proj.weight", rnd({H, I}, DType::BF16));
      }
    } else {
      add(s, p + "mlp.experts.gate_up_proj", rnd({E, 2 * I, H}, DType::BF16));
      add(s, p + "mlp.experts.down_proj", rnd({E, H, I}, DType::BF16));
    }
  }
  for (int s = 0; s < 2; ++s)
    write_safetensors(fmt::format("{}/model-0000{}-of-00002.safetensors", dir, s + 1), shard[s]);
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  std::ofstream(dir + "/config.json") << nlohmann::json{{"model_type", "qwen3_moe"},
                                                        {"hidden_size", H},
                                                        {"num_hidden_layers", L},
                                                        {"num_experts", E},
                                                        {"num_experts_per_tok", 2},
                                                        {"moe_intermediate_size", I},
                                                        {"intermediate_size", 512},
                                                        {"num_attention_heads", heads},
                                                        {"vocab_size", V},
                                                        {"norm_topk_prob", true}}
                                                           .dump();
}

TEST(LoaderEp, GeneratedShardedCheckpointMixedLayoutsQuarterOfExpertBytes) {
  const int R = world().size();
  // Rank 0 writes the checkpoint; every rank learns its directory.
  char path[256] = {};
  if (world().rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / "moe_loader_ep_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    write_generated(tmpl);
    std::snprintf(path, sizeof path, "%s", tmpl.c_str());
  }
  world().broadcast(path, sizeof path, 0);
  for (const auto& [ep, tp, attn_tp] : layouts()) {
    if (attn_tp > 1) continue;  // the bound below is the for --ep / --tp; attention TP is checked above
    SCOPED_TRACE(fmt::format("--ep {} --tp {}", ep, tp));
    const Bytes b = load_rank_share(path, ep, tp);
    EXPECT_LE(b.read, b.bound);
    EXPECT_EQ(b.read, b.planned);
    if (16 % R == 0) {
      Checkpoint ck = Checkpoint::open(path);
      const Inventory inv = take_inventory(ck);
      // The bound: non-expert bytes + 1/R of the expert bytes (1/ep of the
      // experts, 1/tp of each) + headers.
      EXPECT_LE(b.read, inv.non_expert_bytes() + inv.kinds.at(TensorKind::Experts).bytes / R + inv.header_bytes);
    }
  }
  world().barrier();
  if (world().rank() == 0) fs::remove_all(path);
}

TEST(LoaderEp, FusedRowsGiveTheSameLayerAsPerExpertTwin) {
  const int R = world().size(), rank = world().rank();
  for (const auto& [fused, twin, layer] : std::vector<std::tuple<std::string, std::string, int>>{
           {"mixtral_fused", "mixtral", 1}, {"qwen2_moe_fused", "qwen2_moe", 0}}) {
    SCOPED_TRACE(fused);
    const std::string fdir = std::string(MOE_FIXTURES_DIR) + "/" + fused, tdir = std::string(MOE_FIXTURES_DIR) + "/" + twin;
    const Tensor x = SafetensorsFile::open(fmt::format("{}/golden/L{}_T33_in.safetensors", tdir, layer))
                         ->view("hidden_states")
                         .clone();
    Tensor y[2];
    int i = 0;
    for (const std::string& dir : {fdir, tdir}) {
      Checkpoint ck = Checkpoint::open(dir);
      const MoeConfig cfg = MoeConfig::from_hf(ck.config());
      if (cfg.n_experts < R) GTEST_SKIP();
      const Placement pl = Placement::contiguous(cfg.n_experts, R, 1);
      MlpLoadOptions o;
      o.expert_begin = pl.begin(rank);
      o.expert_end = pl.end(rank);
      EpOptions eo;
      eo.comm = MoeComm::AllToAll;
      EpMoeLayer ep(MoeLayer(cfg, load_moe_layer(ck, cfg, layer, o)), world(), pl, eo);
      y[i++] = ep.forward(rank == 0 ? x : x.slice_rows(0, 0).clone());  // rank 0 holds every token
    }
    ASSERT_EQ(y[0].nbytes(), y[1].nbytes());
    EXPECT_EQ(0, std::memcmp(y[0].raw(), y[1].raw(), y[0].nbytes()));
  }
}

}  // namespace
}  // namespace moe
