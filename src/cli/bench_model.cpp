// `moe-ep bench-model`: a whole generated model with the layer shapes of a public
// MoE checkpoint (Qwen3-30B-A3B), random bf16 weights (--quantize w8a8: W8A8 int8
// routed experts), timed end to end.
//
// The model is the real engine (model/model.h) loaded from a temporary checkpoint that
// holds everything but the routed experts (config.json, embedding, norms, attention,
// lm_head); the MoE blocks come from bench::random_layer through
// ModelOptions::moe_weights (expert e depends only on e, so any rank builds its own
// experts). The checkpoint directory is removed once every rank has loaded.
//
// Before timing it checks the result, with checks that can fail:
//   * one MoE block of the model's weights against moe_reference on a sample of rows;
//   * a batch of two prompts gives bitwise the logits of each prompt run alone;
//   * KV-cached greedy decode gives bitwise the logits of a fresh prefill of the prompt
//     plus the generated tokens;
//   * every timed decode pass generates the tokens of the untimed one.
// Then it measures prefill tokens/s of one prompt of --prefill tokens, and decode
// tokens/s at each --decode-batch (steady state: the prompts prefilled first), and
// compares decode with the DRAM floor: the bytes a decode step must read (attention,
// router and norm weights, the experts the step's tokens touched, the KV cache of the
// context, lm_head) over the read bandwidth measured in the same run (kernels/probes.h).
// Under mpirun (--ep N: attention replicated; --tp or --attn-tp N: heads, and under
// --attn-tp the vocabulary, split) the floor of a step is the slowest rank's
// bytes over its bandwidth, the ranks probing the memory at once.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/atomic_file.h"
#include "cli/bench_common.h"
#include "cli/model_opts.h"
#include "cli/parallel_opts.h"
#include "cli/verbs.h"
#include "comm/consistency.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "kernels/probes.h"
#include "loader/safetensors.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/weights.h"
#include "loader/shard.h"
#include "moe/placement.h"
#include "moe/slot_weights.h"
#include "runtime/runner.h"
#include "runtime/sampler.h"

namespace moe {

namespace {

using bench::max_over_ranks;
using bench::median;

struct ModelShape {
  const char* name;
  int64_t hidden, heads, kv_heads, head_dim, experts, topk, inter, vocab;
  double rope_theta;
};
// From the checkpoints' config.json.
constexpr ModelShape kModelShapes[] = {
    {"qwen3-30b-a3b", 2048, 32, 4, 128, 128, 8, 768, 151936, 1e6},
};

struct BenchModelOptions {
  std::string shape = "qwen3-30b-a3b";
  std::string model_dir;  // --model: a checkpoint instead of the generated model
  int64_t layers = 4;
  int64_t vocab = 32000;
  std::string dtype = "bf16";
  std::string quantize = "none";  // "w8a8": routed experts W8A8 int8 (ModelOptions::quantize_w8a8)
  std::string kv_cache_dtype = "f32";  // ModelOptions::kv_cache_dtype
  int64_t prefill = 512;
  std::vector<int64_t> decode_batch = {1, 16};
  int64_t decode_context = 128;
  int64_t decode_steps = 16;
  int repeats = 3;
  std::string json_path, work_dir;
  bool skip_check = false;
  ParallelOptions parallel;
};


// Prompt b of `n` tokens: fixed pseudo-random ids (tools/bench_transformers.py uses the same formula).
std::vector<int32_t> prompt_ids(int64_t b, int64_t n, int64_t vocab) {
  std::vector<int32_t> p(n);
  for (int64_t j = 0; j < n; ++j) p[j] = static_cast<int32_t>((17 + 7919 * b + 104729 * j) % vocab);
  return p;
}


// Writes config.json and every non-expert tensor of the generated model (bf16 or f32).
void write_checkpoint(const std::string& dir, const ModelShape& s, const BenchModelOptions& o) {
  const int64_t H = s.hidden, hd = s.head_dim, nq = s.heads * hd, nkv = s.kv_heads * hd, V = o.vocab;
  nlohmann::json cfg = {{"architectures", {"Qwen3MoeForCausalLM"}},
                        {"model_type", "qwen3_moe"},
                        {"hidden_size", H},
                        {"intermediate_size", 6144},
                        {"moe_intermediate_size", s.inter},
                        {"num_attention_heads", s.heads},
                        {"num_key_value_heads", s.kv_heads},
                        {"head_dim", hd},
                        {"num_hidden_layers", o.layers},
                        {"num_experts", s.experts},
                        {"num_experts_per_tok", s.topk},
                        {"norm_topk_prob", true},
                        {"decoder_sparse_step", 1},
                        {"mlp_only_layers", nlohmann::json::array()},
                        {"vocab_size", V},
                        {"rms_norm_eps", 1e-6},
                        {"rope_parameters", {{"rope_theta", s.rope_theta}, {"rope_type", "default"}}},
                        {"max_position_embeddings", 40960},
                        {"tie_word_embeddings", false},
                        {"hidden_act", "silu"},
                        {"attention_bias", false},
                        {"use_sliding_window", false}};
  write_file_atomic(dir + "/config.json", cfg.dump(1) + "\n", "the model config");
  const DType dt = parse_dtype(o.dtype);
  std::vector<std::pair<std::string, Tensor>> t;
  auto rnd = [&](const Shape& shape, float scale, uint64_t seed) {
    return bench::random_tensor(shape, scale, seed, dt).to(dt);
  };
  auto ones = [&](int64_t n) {
    Tensor x = Tensor::empty({n}, DType::F32);
    std::fill(x.data<float>(), x.data<float>() + n, 1.f);
    return x.to(dt);
  };
  const ModelKeys keys;
  t.emplace_back(keys.embed + ".weight", rnd({V, H}, 1.f, 11));
  t.emplace_back(keys.final_norm + ".weight", ones(H));
  t.emplace_back(keys.lm_head + ".weight", rnd({V, H}, std::sqrt(3.f / H), 12));
  for (int64_t l = 0; l < o.layers; ++l) {
    const AttentionKeys ak = gqa_attention_keys(l, true);
    const uint64_t s0 = 1000 + 16 * static_cast<uint64_t>(l);
    t.emplace_back(keys.input_norm(l) + ".weight", ones(H));
    t.emplace_back(keys.post_attn_norm(l) + ".weight", ones(H));
    t.emplace_back(ak.q + ".weight", rnd({nq, H}, std::sqrt(3.f / H), s0 + 1));
    t.emplace_back(ak.k + ".weight", rnd({nkv, H}, std::sqrt(3.f / H), s0 + 2));
    t.emplace_back(ak.v + ".weight", rnd({nkv, H}, std::sqrt(3.f / H), s0 + 3));
    t.emplace_back(ak.o + ".weight", rnd({H, nq}, std::sqrt(3.f / nq), s0 + 4));
    t.emplace_back(ak.q_norm + ".weight", ones(hd));
    t.emplace_back(ak.k_norm + ".weight", ones(hd));
  }
  write_safetensors(dir + "/model.safetensors", t, {{"producer", "moe-ep bench-model"}});
}

// Removes the temporary checkpoint when the scope ends (also on errors).
struct DirGuard {
  std::string dir;
  ~DirGuard() {
    if (dir.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// One greedy step over `seqs`: forward, argmax (rank 0's tokens broadcast so that the
// ranks never disagree), append. Returns the logits; token_only (what the timings run) asks
// for the best logit of each row only (StepBatch::logit_top_k: the decode a server
// runs, whose vocabulary-parallel lm_head then gathers one pair per rank and row).
Tensor greedy_step(Model& m, const std::vector<Sequence*>& seqs, bool token_only = true) {
  StepBatch b = prepare_step(seqs, false);
  if (token_only) b.logit_top_k.assign(b.logit_rows.size(), 1);
  Tensor logits = m.forward(b);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> next(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) next[i] = sample_token(logits.data<float>() + i * V, V, SamplingParams{}, 0, 0);
  if (m.world_size() > 1) m.world()->broadcast(next.data(), next.size() * sizeof(int32_t), 0);
  commit_step(seqs);
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->tokens.push_back(next[i]);
  return logits;
}

std::vector<Sequence*> ptrs(std::vector<Sequence>& v) {
  std::vector<Sequence*> p;
  for (auto& s : v) p.push_back(&s);
  return p;
}

Sequence make_seq(int32_t slot, std::vector<int32_t> prompt) {
  Sequence s;
  s.id = slot;
  s.slot = slot;
  s.n_prompt = static_cast<int64_t>(prompt.size());
  s.tokens = std::move(prompt);
  return s;
}

struct Diff {
  double max_abs = 0, max_ref = 0;
};
void diff_into(Diff& d, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(double(a[i]) - b[i]));
    d.max_ref = std::max(d.max_ref, std::fabs(double(b[i])));
  }
}

// Model-level checks (see the file comment). Returns "ok (...)" or a failure text.
std::string check_model(Model& m, bool exact, bool* ok) {
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> p0 = prompt_ids(100, 9, V), p1 = prompt_ids(101, 5, V);
  constexpr int kSteps = 3;
  // Batch of two, then decode kSteps greedy tokens with the KV cache.
  std::vector<Sequence> both = {make_seq(0, p0), make_seq(1, p1)};
  const Tensor l_batch = greedy_step(m, ptrs(both), false);
  Tensor l_dec;
  for (int s = 0; s < kSteps; ++s) l_dec = greedy_step(m, ptrs(both), false);
  // Each prompt alone (other slots), and the fresh prefill of prompt + generated tokens.
  Diff batch_d, dec_d;
  for (int i = 0; i < 2; ++i) {
    std::vector<Sequence> one = {make_seq(2 + i, i == 0 ? p0 : p1)};
    const Tensor l1 = greedy_step(m, ptrs(one), false);
    diff_into(batch_d, l1.data<float>(), l_batch.data<float>() + i * V, V);
    std::vector<int32_t> full = both[i].tokens;
    full.pop_back();  // the last token is sampled from l_dec, not yet run
    std::vector<Sequence> re = {make_seq(4 + i, full)};
    const Tensor l2 = greedy_step(m, ptrs(re), false);
    diff_into(dec_d, l2.data<float>(), l_dec.data<float>() + i * V, V);
  }
  // exact: bitwise (one rank, or an all-to-all strategy); else summation-order noise.
  const double tol_b = exact ? 0.0 : 1e-5 * std::max(1.0, batch_d.max_ref);
  const double tol_d = exact ? 0.0 : 1e-5 * std::max(1.0, dec_d.max_ref);
  *ok = batch_d.max_abs <= tol_b && dec_d.max_abs <= tol_d && std::isfinite(batch_d.max_ref) && batch_d.max_ref > 0;
  return fmt::format("{} (batch of 2 vs alone: max|diff| {:.2e}; KV decode {} steps vs fresh prefill: max|diff| {:.2e}; "
                     "bound {}; max|logit| {:.2f})",
                     *ok ? "ok" : "FAILED", batch_d.max_abs, kSteps, dec_d.max_abs, exact ? "bitwise" : "1e-5 relative",
                     batch_d.max_ref);
}

struct DecodeResult {
  double tokens_per_s = 0, step_ms = 0, floor_ms = 0;
  std::vector<double> pass_tps;
  double bytes_per_step = 0;      // this rank
  double experts_per_layer = 0;   // distinct experts touched per MoE layer and step (this rank's)
  double attn_bytes = 0, kv_bytes = 0, moe_bytes = 0, head_bytes = 0;  // per step, this rank
  bool tokens_ok = true;
};

struct RankBytes {
  std::vector<double> fixed;    // per layer: attention + norms, and the dense MLP or router + shared experts
  double expert_bytes = 0;      // one routed expert (W13 + W2) on this rank
  double kv_per_pos_layer = 0;  // K + V of one position (at the cache's dtype)
  double head = 0;              // lm_head + final norm
  double embed_row = 0;
  std::vector<std::vector<int32_t>> experts;  // per layer: the logical experts this rank holds (empty: dense)
};

DecodeResult run_decode(Model& m, Communicator& world, int64_t B, const BenchModelOptions& o, const RankBytes& rb,
                        double bw_gbs) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size;
  std::vector<Sequence> seqs;
  for (int64_t b = 0; b < B; ++b) seqs.push_back(make_seq(static_cast<int32_t>(b), prompt_ids(b, o.decode_context, V)));
  greedy_step(m, ptrs(seqs));  // prefill (untimed): the first token of each
  const std::vector<Sequence> start = seqs;

  DecodeResult r;
  // Untimed pass with expert counting: which experts each step touches on this rank.
  m.set_count_experts(true);
  double floor_s = 0, experts_tot = 0;
  int64_t moe_layers = 0;
  for (int64_t s = 0; s < o.decode_steps; ++s) {
    const auto before = m.expert_load();
    int64_t ctx = 0;  // K/V positions the step reads: every sequence's tokens so far
    for (const auto& q : seqs) ctx += static_cast<int64_t>(q.tokens.size());
    greedy_step(m, ptrs(seqs));
    double moe = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const auto& now = m.expert_load()[l];
      if (now.empty()) continue;
      int64_t touched = 0;
      for (int32_t e : rb.experts[l]) touched += now[e] > before[l][e];
      moe += touched * rb.expert_bytes;
      experts_tot += touched;
      if (s == 0) ++moe_layers;
    }
    double attn = 0;  // with each layer's router, shared experts or dense MLP
    for (double f : rb.fixed) attn += f;
    const double kv = c.n_layers * ctx * rb.kv_per_pos_layer;
    const double head = rb.head + B * rb.embed_row;
    r.attn_bytes += attn;
    r.kv_bytes += kv;
    r.moe_bytes += moe;
    r.head_bytes += head;
    floor_s += (attn + kv + moe + head) / (bw_gbs * 1e9);
  }
  m.set_count_experts(false);
  const std::vector<Sequence> ref = seqs;
  const double n = static_cast<double>(o.decode_steps);
  r.attn_bytes /= n;
  r.kv_bytes /= n;
  r.moe_bytes /= n;
  r.head_bytes /= n;
  r.bytes_per_step = r.attn_bytes + r.kv_bytes + r.moe_bytes + r.head_bytes;
  r.experts_per_layer = moe_layers > 0 ? experts_tot / n / moe_layers : 0;
  r.floor_ms = max_over_ranks(world, floor_s / n) * 1e3;  // the slowest rank's floor

  // Timed passes from the same start: the cache positions are rewritten with the same values.
  for (int rep = 0; rep < o.repeats; ++rep) {
    seqs = start;
    world.barrier();
    const double t0 = now_s();
    for (int64_t s = 0; s < o.decode_steps; ++s) greedy_step(m, ptrs(seqs));
    const double dt = max_over_ranks(world, now_s() - t0);
    r.pass_tps.push_back(B * n / dt);
    for (size_t i = 0; i < seqs.size(); ++i) r.tokens_ok = r.tokens_ok && seqs[i].tokens == ref[i].tokens;
  }
  r.tokens_per_s = median(r.pass_tps);
  r.step_ms = B * 1e3 / r.tokens_per_s;
  return r;
}

// Multiply-adds of one token through the model, without attention scores (2 flops each):
// every attention weight (GQA or MLA, model_reads), the router, k experts, the shared
// experts or the dense MLP.
double macs_per_token_linear(const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  const double H = c.hidden_size;
  double macs = 0;
  for (const TensorRead& r : model_reads(c, 0, 1))
    if (r.layer >= 0 && r.shape.size() == 2) macs += static_cast<double>(r.shape[0] * r.shape[1]);
  for (int64_t l = 0; l < c.n_layers; ++l)
    macs += m.is_moe_layer(l) ? m.n_experts * H + (m.top_k * m.moe_intermediate_size + m.shared_intermediate_size) * 3.0 * H
                              : 3.0 * m.dense_intermediate_size * H;
  return macs;
}

// The bytes a decode step reads on this rank, per part, as the model holds them:
// attention and norms are this rank's slices (model_reads, as Model::load reads them:
// split over --tp or --attn-tp, the vocabulary too under --attn-tp) at --dtype,
// 1-D tensors in f32; routers in f32; shared experts and dense MLPs whole, or split
// over --attn-tp; one routed expert at --dtype (W8A8: int8 + an f32 scale and an i32
// compensation per output column, kernels/grouped_gemm.h); K/V per position at the
// cache's dtype (MLA: the latent and the RoPE key, whole on every rank).
RankBytes rank_bytes(Model& m, const BenchModelOptions& o, DType dtype, DType kv_dtype, bool w8a8) {
  const ModelConfig& c = m.config();
  const MoeConfig& mc = c.moe;
  const int rank = m.rank();
  const int tp = o.parallel.par.tp, attn_tp = o.parallel.par.attn_tp;
  const int group = attn_tp > 1 ? attn_tp : tp, group_rank = attn_tp > 1 ? rank % attn_tp : rank % tp;
  const double esz = static_cast<double>(dtype_size(dtype)), H = static_cast<double>(c.hidden_size);
  RankBytes rb;
  rb.fixed = layer_held_bytes(c, group_rank, group, esz);
  const double mlp_split = attn_tp > 1 ? attn_tp : 1;  // shared experts, dense MLPs: whole under --tp
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!mc.is_moe_layer(l)) {
      rb.fixed[l] += esz * 3.0 * H * static_cast<double>(mc.dense_intermediate_size) / mlp_split;
      continue;
    }
    rb.fixed[l] += 4.0 * static_cast<double>(mc.n_experts) * H;  // router
    if (mc.shared_intermediate_size > 0)
      rb.fixed[l] += esz * 3.0 * H * static_cast<double>(mc.shared_intermediate_size) / mlp_split;
  }
  const double Il = static_cast<double>(mc.moe_intermediate_size / tp);
  rb.expert_bytes = w8a8 ? 3.0 * Il * H + 8.0 * (2 * Il + H) : esz * 3.0 * Il * H;
  const double kv_esz = static_cast<double>(dtype_size(kv_dtype));
  rb.kv_per_pos_layer =
      c.attention == AttentionKind::Mla
          ? kv_esz * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim)
          : kv_esz * 2.0 * static_cast<double>(kv_heads_per_rank(c.n_kv_heads, group) * c.head_dim);
  rb.head = esz * static_cast<double>(c.vocab_size / (attn_tp > 1 ? attn_tp : 1)) * H + 4.0 * H;
  // A token's embedding row (--attn-tp: read by the rank whose rows hold it, 1/N of the
  // tokens on the mean).
  rb.embed_row = esz * H / (attn_tp > 1 ? attn_tp : 1);
  // The experts this EP rank holds, layer by layer (its placement's slots: contiguous,
  // redundant or from a file).
  rb.experts.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (mc.is_moe_layer(l)) rb.experts[l] = m.placement(l).rank_experts(rank / tp);
  return rb;
}

int run_bench_model(const BenchModelOptions& o) {
  const ModelShape* shape = nullptr;
  for (const auto& s : kModelShapes)
    if (o.shape == s.name) shape = &s;
  MOE_CHECK(shape, "--shape {}: unknown model shape (known: qwen3-30b-a3b)", o.shape);
  MOE_CHECK(o.layers >= 1 && o.layers <= 64, "--layers must be in [1, 64], got {}", o.layers);
  MOE_CHECK(o.vocab >= 16, "--vocab must be at least 16, got {}", o.vocab);
  MOE_CHECK(o.prefill >= 1 && o.decode_context >= 1 && o.decode_steps >= 1 && o.repeats >= 1,
            "--prefill, --decode-context, --decode-steps and --repeats must be positive");
  for (int64_t b : o.decode_batch) MOE_CHECK(b >= 1 && b <= 256, "--decode-batch values must be in [1, 256], got {}", b);
  MOE_CHECK(o.parallel.par.dp == 1,
            "bench-model runs pure EP (attention replicated), --tp or --attn-tp; --dp {} is not supported here",
            o.parallel.par.dp);
  Communicator& world = parallel_world(o.parallel);
  const int R = world.size(), rank = world.rank();
  const bool root = rank == 0;
  if (R > 1)
    check_same_on_all_ranks(world, {{"flags", fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {}", o.model_dir, o.shape,
                                                          o.layers, o.vocab, o.dtype, o.quantize, o.kv_cache_dtype,
                                                          o.prefill,
                                                          fmt::join(o.decode_batch, ","), o.decode_context,
                                                          o.decode_steps, o.repeats, o.parallel.flags_string())}});
  const DType dtype = parse_dtype(o.dtype);
  const bool w8a8 = o.quantize == "w8a8";
  // The routed experts' dtype (what bench::random_layer packs and check_sample checks).
  const DType experts_dtype = w8a8 ? DType::I8 : dtype;
  const int64_t max_b = *std::max_element(o.decode_batch.begin(), o.decode_batch.end());

  // The checkpoint without the experts: rank 0 writes it; every rank loads it.
  const double t_build = now_s();
  int64_t tag = root ? static_cast<int64_t>(getpid()) : 0;
  world.broadcast(&tag, sizeof tag, 0);
  std::string base = o.work_dir;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp && *tmp ? tmp : "/tmp";
  }
  DirGuard guard;
  const bool generated = o.model_dir.empty();
  const std::string dir = generated ? fmt::format("{}/moe-ep-bench-model-{}", base, tag) : o.model_dir;
  if (root && generated) {
    guard.dir = dir;
    std::filesystem::create_directories(dir);
    write_checkpoint(dir, *shape, o);
  }
  world.barrier();

  ModelConfig mc;
  if (generated) {
    std::ifstream in(dir + "/config.json");
    mc = model_config_from_hf(nlohmann::json::parse(in));
  }
  MoeLayerWeights layer0;  // shares layer 0's storage, for the MoE check
  ModelOptions mo;
  mo.dtype = dtype;
  mo.quantize_w8a8 = w8a8;
  mo.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  mo.n_slots = std::max<int64_t>(max_b, 6);
  mo.max_seq = std::max<int64_t>({o.prefill, o.decode_context + o.decode_steps + 2, 16});
  mo.world = &world;
  mo.par = o.parallel.par;
  mo.ep = o.parallel.ep_options();
  mo.eplb = o.parallel.eplb;
  if (world.rank() == 0) mo.eplb.log = [](const std::string& s) { fmt::print(stderr, "{}\n", s); };
  if (generated) mo.moe_weights = [&](int64_t l, const MlpLoadOptions& lo) {
    const int64_t end = lo.expert_end < 0 ? mc.moe.n_experts : lo.expert_end;
    MoeLayerWeights w = bench::random_layer(mc.moe, lo.quantize_w8a8 ? DType::I8 : lo.compute, lo.expert_begin, end,
                                            lo.tp_rank, lo.tp_size);
    if (l == 0) layer0 = w;
    return w;
  };
  std::unique_ptr<Model> model = Model::load(dir, mo);
  world.barrier();
  if (root && generated) std::filesystem::remove_all(dir);  // the embedding stays mapped
  guard.dir.clear();
  const double build_s = now_s() - t_build;
  Model& m = *model;
  const ModelConfig& c = m.config();
  const int64_t H = c.hidden_size, tp = o.parallel.par.tp, attn_tp = o.parallel.par.attn_tp;
  const RankBytes rb = rank_bytes(m, o, dtype, mo.kv_cache_dtype, w8a8);

  const int threads = num_threads();
  if (root)
    fmt::print(
        "moe-ep bench-model: shape {} ({} layers of H={} heads {}/{} head_dim {} E={} k={} I={}), vocab {}{}, dtype "
        "{}, KV cache {}, {} rank(s) ({}, moe-comm {}), {} threads per rank, {}\n  built in {:.1f} s (this rank holds "
        "{} experts of its first MoE layer)\n",
        o.model_dir.empty() ? o.shape : o.model_dir, c.n_layers, H, c.n_heads, c.n_kv_heads, c.head_dim, c.moe.n_experts, c.moe.top_k,
        c.moe.moe_intermediate_size, c.vocab_size, !generated || c.vocab_size == shape->vocab ? "" : fmt::format(" (the checkpoint's: {})", shape->vocab),
        w8a8 ? o.dtype + " (routed experts w8a8)" : o.dtype, o.kv_cache_dtype, R, to_string(o.parallel.par), o.parallel.moe_comm,
        threads, cpu_summary(), build_s, [&] {
          for (const auto& e : rb.experts)
            if (!e.empty()) return e.size();
          return size_t{0};
        }());

  // ---- checks ----
  bool all_ok = true;
  std::string moe_check = "skipped", model_check = "skipped";
  if (!o.skip_check) {
    const Tensor x = bench::random_tensor({4, H}, 1.f, 4242);
    Tensor y;
    bool ok = !generated;  // --model: the checkpoint's experts are not bench::random_layer's
    if (!generated) {
      moe_check = "skipped (--model: the checkpoint's experts)";
    } else if (R == 1) {
      MoeLayer probe(c.moe, layer0);
      y = probe.forward(x);
    } else {
      // Layer 0's placement (redundant slots or a file: several loads of expert runs,
      // so the probe's slots are rebuilt from their seeds).
      const Placement& pl = m.placement(0);
      MoeLayerWeights w = layer0;
      if (!pl.identity()) {
        ParallelGroups groups(world, o.parallel.par);
        w = load_slot_weights(pl, groups.ep_rank(), [&](int64_t b, int64_t e) {
          return bench::random_layer(c.moe, w8a8 ? DType::I8 : dtype, b, e, groups.tp_rank(), static_cast<int>(tp));
        });
      }
      EpMoeLayer probe(MoeLayer(c.moe, std::move(w)), world, pl, o.parallel.ep_options());
      y = probe.forward_replicated(x);
    }
    if (generated) moe_check = bench::check_sample(c.moe, layer0, x, y, experts_dtype, &ok);
    const MoeComm comm = o.parallel.ep_options().comm;
    const bool exact = R == 1 || ((comm == MoeComm::AllToAll || comm == MoeComm::AllToAllLL || comm == MoeComm::Auto) &&
                                  attn_tp == 1);
    bool ok2 = false;
    model_check = check_model(m, exact, &ok2);
    float bad = ok && ok2 ? 0.f : 1.f;
    world.all_reduce_sum(&bad, 1);
    all_ok = bad == 0;
    if (root) fmt::print("  check: MoE layer 0 vs moe_reference: {}\n  check: model: {}\n", moe_check, model_check);
    if (!all_ok) {
      if (root) fmt::print(stderr, "moe-ep bench-model: the check FAILED on {} rank(s); not timing\n", int(bad));
      return 2;
    }
  }
  layer0 = MoeLayerWeights();

  // ---- limits, measured now (every rank at once: the ranks share the memory) ----
  world.barrier();
  const double bw = measure_read_bandwidth_gbs(size_t(512) << 20, threads);
  const double bw_min = -max_over_ranks(world, -bw);
  // The peak of the --dtype kernels (attention, lm_head, shared experts; the routed
  // experts too unless --quantize w8a8) at the active ISA level (kernels/probes.h).
  const PeakProbe probe = kernel_peak_probe(dtype);
  const double peak = measure_peak(probe, threads);
  const double peak_sum = -max_over_ranks(world, -peak) * R;  // the job's compute peak
  if (root)
    fmt::print("  limits: read bandwidth {:.1f} GB/s per rank ({} rank(s) probing at once), peak: {} {:.0f} {} "
               "(all ranks)\n\n",
               bw_min, R, peak_probe_name(probe), peak_sum, peak_probe_unit(probe));

  nlohmann::json rec;
  rec["shape"] = o.shape;
  rec["layers"] = c.n_layers;
  rec["vocab"] = c.vocab_size;
  rec["dtype"] = o.dtype;
  rec["quantize"] = o.quantize;
  rec["kv_cache_dtype"] = o.kv_cache_dtype;
  rec["ranks"] = R;
  rec["parallel"] = to_string(o.parallel.par);
  rec["moe_comm"] = o.parallel.moe_comm;
  rec["threads_per_rank"] = threads;
  rec["read_bw_gbs_per_rank"] = bw_min;
  rec["peak_gflops"] = peak_sum;
  rec["peak_name"] = peak_probe_name(probe);
  rec["check"] = {{"moe_layer", moe_check}, {"model", model_check}};

  // ---- prefill: one prompt of --prefill tokens ----
  {
    std::vector<double> tps;
    const std::vector<int32_t> p = prompt_ids(0, o.prefill, c.vocab_size);
    for (int rep = 0; rep < o.repeats + 1; ++rep) {
      std::vector<Sequence> one = {make_seq(0, p)};
      world.barrier();
      const double t0 = now_s();
      greedy_step(m, ptrs(one));
      const double dt = max_over_ranks(world, now_s() - t0);
      if (rep > 0) tps.push_back(o.prefill / dt);  // the first is a warm-up
    }
    const double t = median(tps);
    const double P = static_cast<double>(o.prefill);
    // QK^T and PV, causal: per head the q.k length plus the value length (MLA: the
    // unabsorbed nope + rope and v dims).
    const bool mla = c.attention == AttentionKind::Mla;
    const double qk_pv = mla ? static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
                             : 2.0 * static_cast<double>(c.head_dim);
    const double flops = 2.0 * (P * macs_per_token_linear(c) + c.vocab_size * H) +
                         2.0 * c.n_layers * c.n_heads * qk_pv * (P * (P + 1) / 2);
    const double gflops = flops * t / P / 1e9;
    if (root)
      fmt::print("prefill {} tokens: {:.1f} tokens/s ({:.1f} ms; {:.0f} GFLOP/s = {:.0f}% of the {} peak; runs: {:.1f})\n",
                 o.prefill, t, P / t * 1e3, gflops, 100 * gflops / peak_sum, o.dtype, fmt::join(tps, ", "));
    rec["prefill"] = {{"tokens", o.prefill}, {"tokens_per_s", t}, {"runs_tokens_per_s", tps}, {"gflops", gflops},
                      {"frac_peak", gflops / peak_sum}};
  }

  // ---- decode ----
  rec["decode"] = nlohmann::json::array();
  for (int64_t B : o.decode_batch) {
    const DecodeResult d = run_decode(m, world, B, o, rb, bw);
    all_ok = all_ok && d.tokens_ok;
    if (root) {
      fmt::print(
          "decode batch {:>3} (context {}+{} steps): {:.1f} tokens/s, {:.2f} ms/step; DRAM floor {:.2f} ms/step "
          "(rank 0 reads {:.1f} MB/step: attention {:.1f}, KV {:.1f}, MoE {:.1f} = {:.1f} experts/layer, lm_head+embed "
          "{:.1f}) -> {:.2f}x the floor; runs: {:.1f}{}\n",
          B, o.decode_context, o.decode_steps, d.tokens_per_s, d.step_ms, d.floor_ms, d.bytes_per_step / 1e6,
          d.attn_bytes / 1e6, d.kv_bytes / 1e6, d.moe_bytes / 1e6, d.experts_per_layer, d.head_bytes / 1e6,
          d.step_ms / d.floor_ms, fmt::join(d.pass_tps, ", "), d.tokens_ok ? "" : "  TOKENS DIFFER between passes");
      rec["decode"].push_back({{"batch", B},
                               {"context", o.decode_context},
                               {"steps", o.decode_steps},
                               {"tokens_per_s", d.tokens_per_s},
                               {"runs_tokens_per_s", d.pass_tps},
                               {"ms_per_step", d.step_ms},
                               {"floor_ms_per_step", d.floor_ms},
                               {"x_floor", d.step_ms / d.floor_ms},
                               {"rank0_bytes_per_step", d.bytes_per_step},
                               {"rank0_bytes", {{"attention", d.attn_bytes}, {"kv_cache", d.kv_bytes},
                                                {"moe", d.moe_bytes}, {"lm_head_embed", d.head_bytes}}},
                               {"rank0_experts_per_layer", d.experts_per_layer},
                               {"tokens_same_every_pass", d.tokens_ok}});
    }
  }
  if (root) {
    fmt::print(
        "\nThe floor of a decode step: the bytes it must read on the slowest rank (attention + router + norms, the "
        "experts its\ntokens touched on that rank (counted from the routing of an untimed pass of the same steps), "
        "K/V of the context\n({} cache), lm_head + the embedding rows) / that rank's read bandwidth, measured once "
        "before prefill: a 512 MB\nbuffer read once with {} loads on {} threads per rank, all ranks at once, best of "
        "5.\nPrefill % of peak: 2 x multiply-adds (linear layers, causal QK^T and PV) per second / peak {} = {} on "
        "{} threads\nper rank, operands in registers (or L1), best of 3 by thread CPU time, summed over the ranks ({} kernels at {}{}).\n",
        o.kv_cache_dtype, read_probe_loads(), threads, peak_probe_name(probe), peak_probe_what(probe), threads, o.dtype,
        isa_name(active_isa()), o.quantize == "w8a8" ? "; the W8A8 routed experts run int8 instructions" : "");
    if (!o.json_path.empty()) {
      write_file_atomic(o.json_path, rec.dump(2) + "\n", "--json");
    }
  }
  if (!all_ok && root) fmt::print(stderr, "moe-ep bench-model: the decode passes disagreed; the timings are not valid\n");
  return all_ok ? 0 : 2;
}

}  // namespace

Verb add_bench_model_verb(CLI::App& app) {
  auto o = std::make_shared<BenchModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench-model",
      "Benchmark a whole generated model with the layer shapes of a public MoE checkpoint (random weights): checks "
      "it, then measures prefill tokens/s and decode tokens/s against the DRAM floor measured in the same run");
  cmd->add_option("--shape", o->shape, "Layer shapes: qwen3-30b-a3b")->capture_default_str();
  cmd->add_option("--model", o->model_dir,
                  "Time this checkpoint (a directory of any family, or a GGUF file) instead of the generated model; "
                  "--shape, --layers "
                  "and --vocab are then unused, and the MoE-layer check (against bench::random_layer's experts) is "
                  "skipped")
      ->check(CLI::ExistingPath);
  cmd->add_option("--layers", o->layers, "Decoder layers (every one MoE)")->capture_default_str();
  cmd->add_option("--vocab", o->vocab,
                  "Vocabulary size (smaller than the checkpoint's 151936 to save memory; the real one works too)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weight dtype: bf16 or f32")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--quantize", o->quantize,
                  "w8a8: the routed experts are W8A8 int8 (weights quantised per output channel from the same random "
                  "f32 weights, per-token dynamic activation scales; the layer check then bounds the cosine vs f32 "
                  "by 0.99); the router stays f32, attention and lm_head stay in --dtype")
      ->check(CLI::IsMember({"none", "w8a8"}))
      ->capture_default_str();
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  cmd->add_option("--prefill", o->prefill, "Prompt length of the prefill measurement")->capture_default_str();
  cmd->add_option("--decode-batch", o->decode_batch, "Batch sizes of the decode measurements (e.g. 1,16)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--decode-context", o->decode_context, "Prompt tokens per sequence before decoding")
      ->capture_default_str();
  cmd->add_option("--decode-steps", o->decode_steps, "Decode steps per timed pass")->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Timed passes per measurement (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Write the results here (rank 0)");
  cmd->add_option("--work-dir", o->work_dir,
                  "Where the temporary checkpoint (non-expert weights) is written; removed after loading "
                  "(default $TMPDIR or /tmp)");
  cmd->add_flag("--skip-check", o->skip_check, "Time without checking the model first");
  add_model_parallel_options(cmd, o->parallel);
  return {cmd, [o] { return run_bench_model(*o); }};
}

}  // namespace moe
