// `moe-ep plan`: sizes an expert-parallel cluster from config.json alone, on paper.
//
// Layout modelled: one rank per node, routed experts split evenly over the nodes (the
// first E % N nodes hold one more), everything else (attention, norms, router, shared
// experts, dense MLP layers, embeddings, lm_head) replicated on every node, attention
// data parallel (each node holds its own sequences and their KV cache), tokens moved by
// the alltoall strategy (moe/dispatch/alltoall.cpp) at prefill:
//   dispatch: one record per (token, remote node holding >= 1 of its k experts):
//             k int32 expert ids + the token row (compute dtype, or a Q8 row of H int8 +
//             one f32 scale under w8a8/w4a8);
//   combine:  one f32 row of H per (token, remote expert slot);
// and alltoall-ll at decode (what --moe-comm auto runs there): a record of an 8-byte
// head + the row per (token, remote expert slot), the same combine.
// Routing is assumed uniform (every expert equally likely); real routers are skewed,
// so the expert and network figures are the balanced case.
//
// Bytes in memory, per parameter: 2-D weights at --dtype (f32 4, bf16 2); 1-D
// tensors (norms, biases) and the router in f32, as the engine keeps them; routed
// experts per --quantize / --fp8 (per expert matrix [n, k]):
//   none  k*n*dtype;  w8a8  k*n + 4n (int8, an f32 scale per output channel);
//   w4a8  k*n/2 + 5 * n * ceil(k/g) (int4, an f32 scale and a u8 zero point per group);
//   fp8   k*n + 4 * ceil(n/128) * ceil(k/128) (e4m3, f32 scales per 128x128 block);
// panel padding of the packed layouts is not counted. KV cache: --kv-cache-dtype (f32 4
// bytes, bf16 2) per value; per token and layer 2 * kv_heads * head_dim values (GQA) or
// kv_lora_rank + qk_rope_head_dim (MLA).
//
// The layouts section compares the four ways moe-ep can run the same N nodes, for one
// conversation and for N x --batch conversations (layout_cost below):
//   dp          --ep N --dp N: the layout above, conversations spread over the nodes.
//   replicated  --ep N: every node runs every conversation with all non-expert weights;
//               one all-gather per MoE layer (the slot gather of moe/dispatch).
//   moe-tp      --tp N: attention heads, GQA's KV and every routed expert's I split N
//               ways, everything else whole; per MoE layer a layout exchange, a
//               dispatch/combine exchange and an all-gather of the outputs.
//   attn-tp     --ep N --attn-tp N: attention heads, GQA's KV cache, shared experts,
//               dense MLPs, embeddings and lm_head split N ways (the bytes of one rank's
//               slices, model_reads on rank 0 of N); per step one all-reduce of the
//               embedding rows, two per layer (attention, MLP block) and one all-gather
//               of the logits (each node's slice, or its --top-k best (value, id) pairs
//               when the sampler reads only those).
// A collective costs ceil(log2 N) x latency (recursive doubling) plus the bytes a node
// sends ("wire"): an all-reduce 2 (N-1)/N x its size (ring; OpenMPI's non-blocking
// binomial reduce + broadcast sends the same in all, unevenly: 1 to 2 x the size per
// node at N = 4), an all-gather its part to each of the N-1 others.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include "cli/verbs.h"
#include "core/check.h"
#include "model/registry.h"
#include "loader/shard.h"
#include "model/attention.h"
#include "model/weights.h"

namespace moe {
namespace {

struct PlanOptions {
  std::string model_dir;
  int nodes = 2;
  double mem_per_node_gib = 0;
  double mem_bw_gbps = 0;   // GB/s (1e9 bytes) a node's cores read from memory
  double net_gbps = 0;      // Gbit/s per node, each direction
  double net_latency_us = 0;
  std::string quantize = "none";
  int64_t int4_group = 32;
  bool fp8 = false;
  std::string dtype = "bf16";
  std::string kv_cache_dtype = "f32";
  int64_t context = 4096;      // tokens of context per sequence (KV cache read per decode step)
  int64_t batch = 1;           // decode sequences per node
  int64_t prefill_tokens = 2048;  // prompt tokens per node per prefill step
  int64_t round_trips = 2;     // network round trips per MoE layer (dispatch + combine)
  double gflops = 0;           // per node, for prefill compute (0: not modelled)
  int64_t top_k = 1;           // logits per row the sampler reads (1 greedy; 0 whole rows: logprobs, penalties)
  bool json = false;
};

// Parameter counts (elements) and bytes of one node's share.
struct Part {
  std::string name;
  double params = 0;
  double bytes = 0;
};

double expert_matrix_bytes(const PlanOptions& o, int64_t n, int64_t k, double dtype_bytes) {
  const double kn = static_cast<double>(k) * static_cast<double>(n);
  if (o.fp8) return kn + 4.0 * std::ceil(n / 128.0) * std::ceil(k / 128.0);
  if (o.quantize == "w8a8") return kn + 4.0 * static_cast<double>(n);
  if (o.quantize == "w4a8")
    return kn / 2 + 5.0 * static_cast<double>(n) * std::ceil(static_cast<double>(k) / static_cast<double>(o.int4_group));
  return kn * dtype_bytes;
}

// P(a node holding `local` of E experts gets >= 1 of a token's k distinct experts).
double p_hit(int64_t E, double local, int64_t k) {
  double miss = 1;
  for (int64_t i = 0; i < k; ++i) miss *= std::max(0.0, (static_cast<double>(E) - local - i) / static_cast<double>(E - i));
  return 1 - miss;
}

// What a decode step of each layout costs (see the top of this file).
struct LayoutInputs {
  int64_t N = 1, n_layers = 0, n_moe = 0, E = 0, k = 1, H = 0, V = 0;
  double attn = 0, attn_tp = -1;  // attention + layer norms: whole, one attention-TP rank's (-1: N does not fit)
  double attn_split = -1;          // one TP rank's attention + norms whatever the MLPs (-1: the heads do not split)
  bool moe_tp_fits = false;        // N divides the experts' I (--tp N)
  double row_bytes = 0;            // one token row as dispatched (compute dtype, or Q8)
  double dense = 0, shared = 0, router = 0;  // dense MLPs, shared experts, routers (all layers, whole)
  double lm = 0, embed_row = 0;              // lm_head (or the tied embedding), one embedding row
  double expert = 0, experts_here = 0;       // one routed expert's bytes; experts on the fullest node
  double kv_seq = 0, kv_tp_share = 1;        // KV bytes of one sequence; the share one attention-TP rank holds
  double dispatch = 0, combine = 0;          // alltoall bytes per token per MoE layer (dp, prefill)
  double dispatch_ll = 0;                    // alltoall-ll's (decode): a record per remote slot
  double bw = 0, net = 0, lat = 0, round_trips = 2;
  int64_t top_k = 1;  // logits a sampled row needs (0: the whole row; see --top-k)
};

struct LayoutCost {
  std::string name, flags;
  bool possible = true;
  double read = 0, collectives = 0, wire = 0, mem_s = 0, net_s = 0, step_s = 0, tokens_per_s = 0;
};

// One decode step of `conv` conversations in all under layout `name`.
LayoutCost layout_cost(const LayoutInputs& in, const std::string& name, int64_t conv) {
  LayoutCost r;
  r.name = name;
  const double N = static_cast<double>(in.N), H = static_cast<double>(in.H);
  const double hops = in.N > 1 ? std::ceil(std::log2(N)) : 0;
  const double link = std::max(in.net, 1e-30);
  // The chance that one of `tokens` uniformly routed tokens picks a given expert.
  auto hit = [&](double tokens) {
    return 1 - std::pow(1 - static_cast<double>(in.k) / static_cast<double>(in.E), tokens);
  };
  auto touched = [&](double tokens) { return in.experts_here * hit(tokens); };
  const double moe_layers = static_cast<double>(in.n_moe), layers = static_cast<double>(in.n_layers);
  const double c = static_cast<double>(conv);
  if (name == "dp") {
    // Conversations spread over the nodes; the fullest node holds ceil(conv / N).
    const double b = std::ceil(c / N);
    r.flags = fmt::format("--ep {} --dp {}", in.N, in.N);
    r.read = in.attn + in.dense + in.shared + in.lm + b * in.embed_row + touched(c) * in.expert * moe_layers +
             b * in.kv_seq;
    r.collectives = in.N > 1 ? in.round_trips * moe_layers : 0;
    // A node sends its own tokens' records and the results of others' slots: on the
    // mean c / N tokens' worth (the busiest node's b tokens set the time).
    r.wire = in.N > 1 ? moe_layers * c / N * (in.dispatch_ll + in.combine) : 0;
    r.net_s = in.N > 1 ? moe_layers * (in.round_trips * in.lat + b * (in.dispatch_ll + in.combine) / link) : 0;
  } else if (name == "replicated") {
    r.flags = fmt::format("--ep {}", in.N);
    r.read = in.attn + in.dense + in.shared + in.lm + c * in.embed_row + touched(c) * in.expert * moe_layers +
             c * in.kv_seq;
    r.collectives = in.N > 1 ? moe_layers : 0;
    // The slot gather: a node sends its 1/N of the c k f32 rows to each other node.
    r.wire = in.N > 1 ? moe_layers * c * static_cast<double>(in.k) * H * 4 * (N - 1) / N : 0;
    r.net_s = in.N > 1 ? moe_layers * hops * in.lat + r.wire / link : 0;
  } else if (name == "moe-tp") {
    // --tp N: heads, KV and every expert's I split N ways; the dense MLPs, shared
    // experts, routers, embeddings and lm_head whole on every node. Every node holds all
    // c tokens (attention TP) and dispatches its 1/N share of them (forward_replicated):
    // each row to the N-1 other nodes, which hold the other slices of its experts, and
    // k partial f32 rows back per (row, node); then the outputs are all-gathered.
    r.flags = fmt::format("--tp {}", in.N);
    r.possible = in.attn_split >= 0 && in.moe_tp_fits;
    r.read = in.attn_split + in.dense + in.shared + in.lm + c * in.embed_row +
             static_cast<double>(in.E) * hit(c) * in.expert / N * moe_layers +
             c * in.kv_seq * in.kv_tp_share;
    // Per MoE layer: the layout exchange, the dispatch/combine exchange, the gather.
    r.collectives = in.N > 1 ? layers + 3 * moe_layers : 0;
    // alltoall-ll at decode: k records (8-byte head + row) to each other node, k f32
    // rows back from each; then the row's output to each other node.
    const double k = static_cast<double>(in.k), per_row = (N - 1) * (k * (8 + in.row_bytes) + k * H * 4 + H * 4);
    r.wire = in.N > 1 ? layers * 2 * (N - 1) / N * c * H * 4 + moe_layers * c / N * per_row : 0;
    r.net_s = in.N > 1 ? r.collectives * hops * in.lat + r.wire / link : 0;
  } else {  // attn-tp
    r.flags = fmt::format("--ep {} --attn-tp {}", in.N, in.N);
    r.possible = in.attn_tp >= 0;
    // The routers stay whole; everything else outside the experts is split N ways (a
    // node looks up the embedding rows of the tokens in its 1/N of the vocabulary).
    r.read = in.attn_tp + in.dense / N + (in.shared - in.router) / N + in.router + in.lm / N + c * in.embed_row / N +
             touched(c) * in.expert * moe_layers + c * in.kv_seq * in.kv_tp_share;
    // The embedding's all-reduce, two per layer, the logits' all-gather.
    r.collectives = in.N > 1 ? 2 * layers + 2 : 0;
    // Logits: a node sends its slice of each row ([V / N] f32), or its top_k best
    // (value, id) pairs when they are fewer (Model::gather_vocab_logits), to each other node.
    const double reduce = 2 * (N - 1) / N * c * H * 4;
    const double slice = static_cast<double>(in.V) / N;
    const double part = in.top_k > 0 && 2.0 * static_cast<double>(in.top_k) < std::floor(slice)
                            ? static_cast<double>(in.top_k) * 8
                            : slice * 4;
    r.wire = in.N > 1 ? (2 * layers + 1) * reduce + (N - 1) * c * part : 0;
    r.net_s = in.N > 1 ? r.collectives * hops * in.lat + r.wire / link : 0;
  }
  r.mem_s = in.bw > 0 ? r.read / in.bw : 0;
  r.step_s = r.mem_s + r.net_s;
  r.tokens_per_s = r.step_s > 0 ? c / r.step_s : 0;
  return r;
}

int run_plan(const PlanOptions& o) {
  const std::string path = o.model_dir + "/config.json";
  std::ifstream in(path);
  MOE_CHECK(in.good(), "--model {}: cannot read {}", o.model_dir, path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL("{}: not valid JSON: {}", path, e.what());
  }
  const ModelConfig c = model_config_from_hf(j);
  const MoeConfig& m = c.moe;
  MOE_CHECK(o.nodes >= 1, "--nodes must be >= 1, got {}", o.nodes);
  MOE_CHECK(!(o.fp8 && o.quantize != "none"), "--fp8 and --quantize {} exclude each other (FP8 experts are the checkpoint's)",
            o.quantize);
  const double db = o.dtype == "f32" ? 4 : 2;
  const int64_t H = c.hidden_size, E = m.n_experts, k = m.top_k, I = m.moe_intermediate_size, N = o.nodes;

  // Everything outside the MLP blocks, as Model::load reads it (model_reads).
  Part embed{"embeddings + lm_head + final norm"}, attn{"attention + layer norms"};
  const std::string embed_key = embed_read(c).key, norm_key = final_norm_read(c).key;
  const auto lm = lm_head_read(c);
  for (const TensorRead& r : model_reads(c, 0, 1)) {
    double n = 1;
    for (int64_t d : r.shape) n *= static_cast<double>(d);
    const double bytes = n * (r.shape.size() >= 2 ? db : 4.0);
    const bool outer = r.key == embed_key || r.key == norm_key || (lm && r.key == lm->weight.key);
    Part& p = outer ? embed : attn;
    p.params += n;
    p.bytes += bytes;
  }
  Part dense{"dense MLP layers"}, shared{"router + shared experts"}, routed{"routed experts (this node's)"};
  double router_bytes = 0;
  int64_t n_moe = 0;
  const double hd = static_cast<double>(H);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!m.is_moe_layer(l)) {
      const double p = 3 * hd * static_cast<double>(m.dense_intermediate_size);
      dense.params += p;
      dense.bytes += p * db;
      continue;
    }
    ++n_moe;
    double router = static_cast<double>(E) * hd + (m.routing.use_correction_bias ? static_cast<double>(E) : 0);
    shared.params += router;
    shared.bytes += router * 4;
    router_bytes += router * 4;  // (attention TP splits the rest of this part, not the router)
    const double sp = 3 * hd * static_cast<double>(m.shared_intermediate_size);
    shared.params += sp;
    shared.bytes += sp * db;
    if (m.shared_expert_gate) {
      shared.params += hd;
      shared.bytes += hd * db;
    }
  }
  const int64_t experts_here = (E + N - 1) / N;  // the fullest node
  const double expert_params = 3 * hd * static_cast<double>(I);
  const double expert_bytes = 2 * expert_matrix_bytes(o, I, H, db) + expert_matrix_bytes(o, H, I, db);
  routed.params = expert_params * static_cast<double>(experts_here * n_moe);
  routed.bytes = expert_bytes * static_cast<double>(experts_here * n_moe);
  const double replicated = embed.bytes + attn.bytes + dense.bytes + shared.bytes;
  const double weights = replicated + routed.bytes;

  const double kv_per_token =
      (o.kv_cache_dtype == "bf16" ? 2.0 : 4.0) * static_cast<double>(c.n_layers) *
      (c.attention == AttentionKind::Mla ? static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim)
                                         : 2.0 * static_cast<double>(c.n_kv_heads * c.head_dim));
  const double mem = o.mem_per_node_gib * 1024.0 * 1024.0 * 1024.0;
  const double kv_need = kv_per_token * static_cast<double>(o.batch * o.context);
  const bool fits = weights + kv_need <= mem;
  const double kv_tokens_free = mem > weights ? (mem - weights) / kv_per_token : 0;

  // Network, per token a node owns, per MoE layer.
  const bool q8 = o.quantize != "none";
  const double row_bytes = q8 ? hd + 4 : hd * db;
  const double local = static_cast<double>(E) / static_cast<double>(N);
  const double remote_nodes = static_cast<double>(N - 1) * p_hit(E, local, k);
  const double dispatch = remote_nodes * (4.0 * static_cast<double>(k) + row_bytes);
  const double combine = static_cast<double>(k) * static_cast<double>(N - 1) / static_cast<double>(N) * hd * 4;
  // Decode runs alltoall-ll (moe/dispatch/alltoall_ll.cpp; --moe-comm auto at decode
  // sizes): a record of an 8-byte head and the row per (token, remote slot).
  const double dispatch_ll = static_cast<double>(k) * static_cast<double>(N - 1) / static_cast<double>(N) * (8 + row_bytes);

  // Decode: one step = every node advances its `batch` sequences by one token.
  const double step_tokens = static_cast<double>(o.batch * N);
  const double touched = static_cast<double>(experts_here) *
                         (1 - std::pow(1 - static_cast<double>(k) / static_cast<double>(E), step_tokens));
  const double embed_row_bytes = hd * db * static_cast<double>(o.batch);
  // lm_head is read whole every step (the tied embedding matrix when there is no lm_head).
  const double lm_bytes = static_cast<double>(c.vocab_size) * hd * db;
  const double decode_read = attn.bytes + dense.bytes + shared.bytes + lm_bytes + embed_row_bytes +
                             touched * expert_bytes * static_cast<double>(n_moe) + kv_need;
  const double bw = o.mem_bw_gbps * 1e9, net = o.net_gbps * 1e9 / 8, lat = o.net_latency_us * 1e-6;
  const double rt = N > 1 ? static_cast<double>(o.round_trips) : 0;
  const double t_mem = bw > 0 ? decode_read / bw : 0;
  const double t_net = N > 1 ? static_cast<double>(n_moe) *
                                   (rt * lat + static_cast<double>(o.batch) * (dispatch_ll + combine) / std::max(net, 1e-30))
                             : 0;
  const double t_step = t_mem + t_net;
  const double decode_tps = t_step > 0 ? step_tokens / t_step : 0;

  // Prefill: every node runs `prefill_tokens` prompt tokens; all its weights are read once.
  const double P = static_cast<double>(o.prefill_tokens);
  const double p_mem = bw > 0 ? weights / bw : 0;
  const double p_net = N > 1 ? static_cast<double>(n_moe) * (rt * lat + P * (dispatch + combine) / std::max(net, 1e-30)) : 0;
  const double active = attn.params + dense.params + shared.params + static_cast<double>(c.vocab_size) * hd +
                        static_cast<double>(k * n_moe) * expert_params;
  const double p_cmp = o.gflops > 0 ? 2 * active * P / (o.gflops * 1e9) : 0;
  const double p_t = p_mem + p_net + p_cmp;
  const double prefill_tps = p_t > 0 ? static_cast<double>(N) * P / p_t : 0;

  // The layouts side by side (layout_cost): one conversation, and N x batch of them.
  LayoutInputs li;
  li.N = N;
  li.n_layers = c.n_layers;
  li.n_moe = n_moe;
  li.E = E;
  li.k = k;
  li.H = H;
  li.V = c.vocab_size;
  li.attn = attn.bytes;
  li.dense = dense.bytes;
  li.shared = shared.bytes;
  li.router = router_bytes;
  li.lm = lm_bytes;
  li.embed_row = hd * db;
  li.expert = expert_bytes;
  li.experts_here = static_cast<double>(experts_here);
  li.kv_seq = kv_per_token * static_cast<double>(o.context);
  li.dispatch = dispatch;
  li.dispatch_ll = dispatch_ll;
  li.combine = combine;
  li.bw = bw;
  li.net = net;
  li.lat = lat;
  li.round_trips = static_cast<double>(o.round_trips);
  li.top_k = o.top_k;
  li.row_bytes = row_bytes;
  li.moe_tp_fits = I % N == 0;
  try {
    // One attention-TP rank's slices, as Model::load reads them under --attn-tp N.
    li.attn_tp = 0;
    for (double b : layer_held_bytes(c, 0, static_cast<int>(N), db)) li.attn_tp += b;
    li.attn_split = li.attn_tp;
    if (c.attention != AttentionKind::Mla)
      li.kv_tp_share = static_cast<double>(kv_heads_per_rank(c.n_kv_heads, static_cast<int>(N))) /
                       static_cast<double>(c.n_kv_heads);
    if (m.shared_intermediate_size % N != 0 || m.dense_intermediate_size % N != 0) li.attn_tp = -1;
  } catch (const Error&) {
    li.attn_tp = -1;  // the heads do not split N ways
  }
  std::vector<std::pair<LayoutCost, LayoutCost>> layouts;  // (one conversation, N x batch)
  for (const char* name : {"dp", "replicated", "moe-tp", "attn-tp"})
    layouts.emplace_back(layout_cost(li, name, 1), layout_cost(li, name, N * o.batch));
  auto best = [&](bool one) {
    const LayoutCost* b = nullptr;
    for (const auto& [lat1, thr] : layouts) {
      const LayoutCost& x = one ? lat1 : thr;
      if (x.possible && (!b || x.tokens_per_s > b->tokens_per_s)) b = &x;
    }
    return b;
  };
  auto command = [&](const LayoutCost& x) {
    return fmt::format("mpirun -np {} moe-ep {} --model {} {}", N, x.name == "dp" ? "generate" : "serve", o.model_dir,
                       x.flags);
  };

  const std::vector<Part> parts = {embed, attn, dense, shared, routed};
  const std::string decode_formula =
      "t_step = bytes read per step / mem_bw + moe_layers * (round_trips * latency + batch * (dispatch_ll + combine) / "
      "net_bw); decode tokens/s = nodes * batch / t_step";
  const std::string prefill_formula =
      "t = node weight bytes / mem_bw + moe_layers * (round_trips * latency + prefill_tokens * (dispatch + combine) / "
      "net_bw) + 2 * active params per token * prefill_tokens / gflops; prefill tokens/s = nodes * prefill_tokens / t";
  if (o.json) {
    nlohmann::ordered_json r;
    r["model"] = c.model_type;
    r["nodes"] = N;
    r["dtype"] = o.dtype;
    r["kv_cache_dtype"] = o.kv_cache_dtype;
    r["experts"] = o.fp8 ? "fp8" : o.quantize;
    auto& pj = r["per_node"] = nlohmann::ordered_json::object();
    for (const Part& p : parts) pj[p.name] = {{"params", p.params}, {"bytes", p.bytes}};
    r["experts_per_node"] = experts_here;
    r["moe_layers"] = n_moe;
    r["weight_bytes_per_node"] = weights;
    r["replicated_bytes_per_node"] = replicated;
    r["kv_bytes_per_token"] = kv_per_token;
    r["kv_bytes_needed"] = kv_need;
    r["kv_tokens_that_fit"] = kv_tokens_free;
    r["fits"] = fits;
    r["dispatch_bytes_per_token_layer"] = dispatch;
    r["combine_bytes_per_token_layer"] = combine;
    r["decode_dispatch_bytes_per_token_layer"] = dispatch_ll;
    r["remote_nodes_per_token"] = remote_nodes;
    r["decode"] = {{"bytes_read_per_step", decode_read}, {"experts_touched_per_node_layer", touched},
                   {"mem_s", t_mem}, {"net_s", t_net}, {"step_s", t_step}, {"tokens_per_s", decode_tps},
                   {"formula", decode_formula}};
    r["prefill"] = {{"mem_s", p_mem}, {"net_s", p_net}, {"compute_s", p_cmp}, {"tokens_per_s", prefill_tps},
                    {"formula", prefill_formula}};
    auto& lj = r["layouts"] = nlohmann::ordered_json::array();
    auto cost_json = [](const LayoutCost& x) {
      return nlohmann::ordered_json{{"bytes_read_per_step", x.read}, {"collectives_per_step", x.collectives},
                                    {"wire_bytes_per_step", x.wire}, {"mem_s", x.mem_s}, {"net_s", x.net_s}, {"step_s", x.step_s},
                                    {"tokens_per_s", x.tokens_per_s}};
    };
    for (const auto& [one, all] : layouts)
      lj.push_back({{"layout", one.name}, {"flags", one.flags}, {"possible", one.possible},
                    {"one_conversation", cost_json(one)}, {"conversations", N * o.batch}, {"cluster", cost_json(all)}});
    if (const LayoutCost* b = best(true)) r["fastest_for_one_conversation"] = {{"layout", b->name}, {"command", command(*b)}};
    if (const LayoutCost* b = best(false)) r["fastest_for_the_cluster"] = {{"layout", b->name}, {"command", command(*b)}};
    fmt::print("{}\n", r.dump(2));
    return 0;
  }
  const auto size = [](double b) {
    if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
    if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
    if (b >= 1024.0) return fmt::format("{:.2f} KiB", b / 1024.0);
    return fmt::format("{:.0f} B", b);
  };
  fmt::print("moe-ep plan: {} ({} layers, {} MoE; {} experts, top-{}; H {}) on {} node(s), one rank each\n",
             c.model_type, c.n_layers, n_moe, E, k, H, N);
  fmt::print("weights: {} (router, norms f32), routed experts {}\n\nper node:\n", o.dtype,
             o.fp8 ? "fp8 (e4m3, 128x128 block scales)" : o.quantize == "none" ? o.dtype : o.quantize);
  for (const Part& p : parts)
    fmt::print("  {:<36} {:>16.0f} params {:>12}\n", p.name, p.params, size(p.bytes));
  fmt::print("  {:<36} {:>16} {:>19}  ({} experts per MoE layer on the fullest node)\n", "weights in all", "",
             size(weights), experts_here);
  fmt::print("  KV cache per token {:.0f} bytes ({}); {} x {} tokens: {}\n", kv_per_token, o.kv_cache_dtype, o.batch,
             o.context, size(kv_need));
  fmt::print("  memory {:.1f} GiB: {} (room for {:.0f} tokens of KV after the weights)\n", o.mem_per_node_gib,
             fits ? "fits" : "DOES NOT FIT", kv_tokens_free);
  fmt::print("\nper token per MoE layer: {:.2f} remote nodes; dispatch {:.0f} bytes (decode: {:.0f}), combine {:.0f} "
             "bytes\n",
             remote_nodes, dispatch, dispatch_ll, combine);
  fmt::print("\ndecode ({} sequence(s) per node, {} tokens of context):\n", o.batch, o.context);
  fmt::print("  bytes read per step per node {} ({:.1f} of {} experts touched per MoE layer)\n", size(decode_read),
             touched, experts_here);
  fmt::print("  memory {:.3f} ms + network {:.3f} ms = {:.3f} ms per step -> {:.1f} tokens/s ({:.1f} per sequence)\n",
             t_mem * 1e3, t_net * 1e3, t_step * 1e3, decode_tps, t_step > 0 ? 1 / t_step : 0.0);
  fmt::print("  {}\n", decode_formula);
  fmt::print("\nprefill ({} tokens per node per step):\n", o.prefill_tokens);
  fmt::print("  memory {:.3f} ms + network {:.3f} ms + compute {} -> {:.0f} tokens/s\n", p_mem * 1e3, p_net * 1e3,
             o.gflops > 0 ? fmt::format("{:.3f} ms", p_cmp * 1e3) : std::string("not modelled (--gflops)"),
             prefill_tps);
  fmt::print("  {}\n", prefill_formula);
  fmt::print("\nlayouts (decode; one conversation, and {} conversations in all):\n", N * o.batch);
  fmt::print("  {:<11} {:<22} {:>12} {:>12} {:>11} {:>9} {:>9} {:>14} {:>12} {:>12}\n", "layout", "flags",
             "read/step", "collectives", "wire/step", "mem ms", "net ms", "tok/s (1 conv)", "read/step", "tok/s (all)");
  for (const auto& [one, all] : layouts) {
    if (!one.possible) {
      fmt::print("  {:<11} {:<22} (the heads or MLP sizes do not split {} ways)\n", one.name, one.flags, N);
      continue;
    }
    fmt::print("  {:<11} {:<22} {:>12} {:>12.0f} {:>11} {:>9.3f} {:>9.3f} {:>14.2f} {:>12} {:>12.1f}\n", one.name,
               one.flags, size(one.read), one.collectives, size(one.wire), one.mem_s * 1e3, one.net_s * 1e3,
               one.tokens_per_s, size(all.read), all.tokens_per_s);
  }
  if (const LayoutCost* b = best(true)) fmt::print("  fastest for one conversation: {}: {}\n", b->name, command(*b));
  if (const LayoutCost* b = best(false)) fmt::print("  fastest for the cluster: {}: {}\n", b->name, command(*b));
  fmt::print("\nAssumed: uniform routing, alltoall dispatch, one rank per node, bandwidths reached in full; "
             "{} round trips per MoE layer.\n",
             o.round_trips);
  return 0;
}

}  // namespace

Verb add_plan_verb(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* p = app.add_subcommand(
      "plan",
      "Size an expert-parallel cluster on paper from config.json alone: bytes per node (experts, attention, "
      "embeddings, KV cache per token), whether it fits, dispatch/combine bytes per token per layer, and modelled "
      "decode and prefill tokens/s from the given bandwidths (the formulas are printed). See docs/SCALE.md");
  p->add_option("--model", o->model_dir, "Model directory holding config.json (no weights needed)")->required();
  p->add_option("--nodes", o->nodes, "Nodes, one rank each; the routed experts are split over them")
      ->check(CLI::PositiveNumber);
  p->add_option("--mem-per-node", o->mem_per_node_gib, "Memory per node, GiB")->required()->check(CLI::PositiveNumber);
  p->add_option("--mem-bw", o->mem_bw_gbps, "Memory read bandwidth per node, GB/s (what its cores reach)")
      ->required()
      ->check(CLI::PositiveNumber);
  p->add_option("--net-gbps", o->net_gbps, "Network bandwidth per node and direction, Gbit/s")
      ->required()
      ->check(CLI::PositiveNumber);
  p->add_option("--net-latency-us", o->net_latency_us, "One-way network latency incl. MPI overhead, microseconds")
      ->required()
      ->check(CLI::NonNegativeNumber);
  p->add_option("--quantize", o->quantize, "Routed experts as --quantize of the other verbs")
      ->check(CLI::IsMember({"none", "w8a8", "w4a8"}));
  p->add_option("--int4-group", o->int4_group, "With --quantize w4a8: values per group")->check(CLI::IsMember({32, 64, 128}));
  p->add_flag("--fp8", o->fp8, "Routed experts in FP8 e4m3 with 128x128 block scales (DeepSeek-V3's checkpoint)");
  p->add_option("--dtype", o->dtype, "Dtype of the other weights (f32, bf16)")->check(CLI::IsMember({"f32", "bf16"}));
  p->add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV cache element type, as --kv-cache-dtype of the other verbs")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  p->add_option("--context", o->context, "Tokens of context per sequence (KV read per decode step, KV to hold)")
      ->check(CLI::PositiveNumber);
  p->add_option("--batch", o->batch, "Decode sequences per node")->check(CLI::PositiveNumber);
  p->add_option("--prefill-tokens", o->prefill_tokens, "Prompt tokens per node per prefill step")
      ->check(CLI::PositiveNumber);
  p->add_option("--round-trips", o->round_trips, "Network round trips per MoE layer (2: dispatch and combine)")
      ->check(CLI::NonNegativeNumber);
  p->add_option("--gflops", o->gflops, "Sustained GFLOP/s per node for prefill compute (0: not modelled)")
      ->check(CLI::NonNegativeNumber);
  p->add_option("--top-k", o->top_k,
                "Logits per row the sampler reads under attention TP: 1 greedy, k for top-k sampling, 0 whole rows "
                "(logprobs, penalties, sampling without top-k); sets the size of the logits gather")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  p->add_flag("--json", o->json, "Print the plan as JSON");
  return {p, [o] { return run_plan(*o); }};
}

}  // namespace moe
