#include "model/model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/stage_profile.h"
#include "loader/checkpoint.h"
#include "loader/fp8_weights.h"
#include "loader/gguf/gguf_types.h"
#include "loader/inventory.h"
#include "loader/moe_weights.h"
#include "loader/progress.h"
#include "loader/shard.h"
#include "model/registry.h"
#include "model/weights.h"
#include "moe/placement.h"
#include "moe/placement_file.h"
#include "moe/slot_weights.h"
#include "runtime/sampler.h"

namespace moe {

namespace {

// generation_config.json's eos_token_id, when present, overrides config.json's.
void read_generation_config(const std::string& dir, ModelConfig& c) {
  const std::string path = dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL("{} is not valid JSON: {}", path, e.what());
  }
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return;
  c.eos_token_ids.clear();
  if (it->is_number_integer()) c.eos_token_ids.push_back(it->get<int64_t>());
  if (it->is_array())
    for (const auto& v : *it)
      if (v.is_number_integer()) c.eos_token_ids.push_back(v.get<int64_t>());
}

// The bytes this rank reads, for the progress line of the load: per decoder layer l,
// its attention and norms (`layer[l]`, from model_reads) and the non-expert part of its
// MLP block (`mlp[l]`: router, shared experts, a dense MLP; the experts' bytes are
// counted by load_moe_layer as it packs them), plus `outside` (embeddings, final norm,
// lm_head). `total` adds this rank's share of the experts: exact on one rank, the
// fraction of its experts under EP (a placement's runs may read a router twice).
struct LoadBytes {
  uint64_t outside = 0, total = 0;
  std::vector<uint64_t> layer, mlp;
};

LoadBytes load_bytes(const Checkpoint& ck, const ModelConfig& c, int tp_rank, int tp, bool vocab_parallel,
                     const MlpLoadOptions& lo, const std::function<double(int64_t)>& expert_share,
                     bool experts_from_ck) {
  LoadBytes b;
  b.layer.assign(c.n_layers, 0);
  b.mlp.assign(c.n_layers, 0);
  for (const TensorRead& r : model_reads(c, tp_rank, tp, vocab_parallel)) {
    const uint64_t n = read_bytes(ck, r);
    (r.layer >= 0 && r.layer < c.n_layers ? b.layer[r.layer] : b.outside) += n;
    b.total += n;
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    uint64_t experts = 0;
    double share = 0;
    try {
      for (const LayerRead& r : mlp_layer_reads(ck, c.moe, l, lo)) {
        const bool expert = r.expert >= 0 || r.role == LayerRead::FusedGateUp || r.role == LayerRead::FusedDown;
        (expert ? experts : b.mlp[l]) += read_bytes(ck, r.tensor_read());
      }
      share = experts_from_ck && c.moe.is_moe_layer(l) ? expert_share(l) : 0.0;
    } catch (const Error&) {
      b.mlp[l] = 0;
      continue;  // only an estimate: the layer's own load reports what is wrong
    }
    b.total += b.mlp[l] + static_cast<uint64_t>(static_cast<double>(experts) * share);
  }
  return b;
}

}  // namespace

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& opt) {
  MOE_CHECK(opt.dtype == DType::F32 || opt.dtype == DType::BF16, "--dtype must be f32 or bf16, got {}",
            dtype_name(opt.dtype));
  std::unique_ptr<Model> m(new Model());
  m->opt_ = opt;
  Checkpoint ck = Checkpoint::open(dir);
  try {
    m->cfg_ = model_config_from_hf(ck.config());
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {}/config.json)", e.what(), dir));
  }
  apply_checkpoint_layout(ck, m->cfg_);
  read_generation_config(dir, m->cfg_);
  const ModelConfig& c = m->cfg_;

  // Parallel layout. tp_rank/tp: MoE-TP (each expert's I). attn_rank/attn: the group
  // attention heads are split over: the MoE-TP group under --tp, the EP group (the DP
  // replica) under --attn-tp, which also splits the shared experts, dense MLPs and the
  // vocabulary (embedding and lm_head rows).
  const bool multi = opt.world && opt.world->size() > 1;
  int tp_rank = 0, tp = 1, attn_rank = 0, attn = 1;
  EpOptions ep_opt = opt.ep;
  if (multi) {
    m->world_ = opt.world;
    m->groups_ = std::make_unique<ParallelGroups>(*opt.world, opt.par);
    tp = opt.par.tp;
    tp_rank = m->groups_->tp_rank();
    const int per_replica = opt.world->size() / opt.par.dp;
    MOE_CHECK(per_replica % tp == 0,
              "--tp {} must divide the {} ranks of each DP replica (--dp {}): attention heads are split over the "
              "TP group inside a replica",
              tp, per_replica, opt.par.dp);
    if (tp > 1) {
      m->tp_ = &m->groups_->moe_tp();
      attn = tp;
      attn_rank = tp_rank;
    }
    if (opt.par.attn_tp > 1) {
      MOE_CHECK(!(opt.ep.comm == MoeComm::AllReduce && opt.par.dp > 1),
                "--moe-comm allreduce needs every rank to hold the same tokens, but --dp {} replicas hold their own",
                opt.par.dp);
      m->tp_ = m->attn_tp_ = &m->groups_->dp_attn();
      attn = opt.par.attn_tp;
      attn_rank = m->groups_->attn_tp_rank();
      // One all-reduce of routed + shared partials per MoE layer when every rank holds
      // the same tokens: fewer bytes than dispatch + combine at 2-8 ranks, and one
      // collective (EpMoeLayer::forward_attn_tp).
      if (opt.par.dp == 1 && ep_opt.comm == MoeComm::Auto) ep_opt.comm = MoeComm::AllReduce;
      ep_opt.shared_partial = true;
    }
  } else {
    MOE_CHECK(opt.par.ep * opt.par.tp * opt.par.dp == 1 || !opt.world,
              "{} needs several ranks: start the job with mpirun", to_string(opt.par));
  }
  const char* attn_flag = opt.par.attn_tp > 1 ? "--attn-tp" : "--tp";
  if (c.attention == AttentionKind::Mla) {
    MOE_CHECK(c.n_heads % attn == 0,
              "{} {} does not divide the model's {} attention heads (attention heads are split over the TP ranks)",
              attn_flag, attn, c.n_heads);
  } else {
    MOE_CHECK(c.n_heads % attn == 0 && (c.n_kv_heads % attn == 0 || attn % c.n_kv_heads == 0),
              "{} {} does not fit the model's {} attention heads and {} key/value heads (query heads are split over "
              "the TP ranks; key/value heads too, or each held by several ranks when there are fewer of them)",
              attn_flag, attn, c.n_heads, c.n_kv_heads);
  }

  // Layers the decoder does not run are skipped aloud: DeepSeek-V3's multi-token-
  // prediction layers (num_nextn_predict_layers, stored after the decoder layers; moe-ep
  // has no speculative decoding), and any layer past those.
  if (m->rank() == 0) {
    if (const auto mtp = mtp_layer_keys(ck, c.moe); !mtp.empty())
      fmt::print(stderr,
                 "moe-ep: note: skipping {} MTP layer{} (num_nextn_predict_layers={}: model.layers.{}{}, {} tensors): "
                 "not loaded, moe-ep does not run multi-token prediction\n",
                 c.moe.n_mtp_layers, c.moe.n_mtp_layers == 1 ? "" : "s", c.moe.n_mtp_layers, c.n_layers,
                 c.moe.n_mtp_layers == 1 ? "" : fmt::format("..{}", c.n_layers + c.moe.n_mtp_layers - 1), mtp.size());
    if (const auto extra = beyond_layer_keys(ck, c.moe); !extra.empty())
      fmt::print(stderr,
                 "moe-ep: warning: {} tensors of layers past num_hidden_layers={} (+ {} MTP) are not loaded, e.g. "
                 "'{}'\n",
                 extra.size(), c.n_layers, c.moe.n_mtp_layers, extra[0]);
  }
  const FamilyHooks& fam = find_family(c.model_type);
  const EplbOptions& eo = opt.eplb;
  const PlacementSource placements(eo, c.moe.n_experts, multi ? opt.par.ep : 1, multi ? tp : 1,
                                   static_cast<int>(c.moe.routing.n_group), opt.world);
  for (const int64_t l : placements.file_layers())
    MOE_CHECK(l < c.n_layers && c.moe.is_moe_layer(l),
              "placement file '{}' places experts of layer {}, which is not a MoE layer of this model",
              eo.placement_file, l);

  // --weights-cache: one file per checkpoint, options, layout and rank. The record keys
  // name every tensor read and the options of each load; the layout line keeps the
  // files of different option sets apart, so switching between them repacks nothing.
  std::unique_ptr<WeightsCache> cache;
  if (!opt.weights_cache_dir.empty() && !opt.moe_weights) {
    WeightsCacheParams cp;
    cp.dir = opt.weights_cache_dir;
    cp.model_path = dir;
    cp.rank = opt.world ? opt.world->rank() : 0;
    cp.layout = fmt::format(
        "dtype {} quantize w8a8 {} w4a8 {} group {} keep-codes {} linears w8a8 {} w4a8 {}; {}; rank {} of {}; "
        "redundant {} placement '{}'",
        dtype_name(opt.dtype), opt.quantize_w8a8, opt.quantize_w4a8, opt.int4_group, opt.gguf_q4_0_as_int4,
        opt.quantize_linears, opt.quantize_linears_w4a8, to_string(opt.par), cp.rank, opt.world ? opt.world->size() : 1,
        opt.eplb.redundant, opt.eplb.placement_file);
    cp.verbose = opt.show_progress;
    cache = WeightsCache::open(cp);
  }

  // A progress line with GB/s (on rank 0; loads under 256 MB print nothing).
  MlpLoadOptions lo0;
  lo0.tp_rank = tp_rank;
  lo0.tp_size = tp;
  lo0.mlp_tp_rank = m->attn_tp_ ? attn_rank : 0;
  lo0.mlp_tp_size = m->attn_tp_ ? attn : 1;
  const LoadBytes lb = load_bytes(
      ck, c, attn_rank, attn, m->attn_tp_ != nullptr, lo0,
      [&](int64_t l) {
        return multi ? static_cast<double>(placements.layer(l).rank_experts(m->groups_->ep_rank()).size()) /
                           static_cast<double>(std::max<int64_t>(1, c.moe.n_experts))
                     : 1.0;
      },
      !opt.moe_weights);
  const std::string from_cache = cache && cache->file_valid() ? " (packed weights from --weights-cache)" : "";
  Progress progress(multi ? fmt::format("moe-ep: loading {}{} (rank 0 of {})", dir, from_cache, opt.world->size())
                          : fmt::format("moe-ep: loading {}{}", dir, from_cache),
                    lb.total, opt.show_progress && (!multi || opt.world->rank() == 0));

  // The weights outside the MLP blocks, as model/weights.h describes them.
  // A view of the mapping (rows are converted per token). A GGUF quantised token_embd
  // (Q8_0, Q4_K, ...) stays its blocks, each row dequantised when a token needs it:
  // bit for bit the values of a dequantised copy, without the copy (V x H x 4 bytes:
  // 1.2 GB for Qwen3-30B-A3B). Tied to lm_head, its dequantised rows live only while
  // lm_head's Linear packs them. FP8 (no release quantises it, but a checkpoint may):
  // dequantised at load.
  // Vocabulary-parallel under --attn-tp (as vLLM's VocabParallelEmbedding): rank r holds
  // the rows [V r / N, V (r + 1) / N) of the embedding and of lm_head. A step looks up the
  // tokens in its rows, zeros for the others, and the attention-TP group sums them
  // (forward): a long-running server touches every row in time, and each rank's mapping
  // then holds 1/N of them.
  m->vocab_ = m->attn_tp_ ? vocab_range(c.vocab_size, attn_rank, attn) : std::pair<int64_t, int64_t>{0, c.vocab_size};
  const TensorRead er = m->attn_tp_ ? embed_read(c, m->vocab_) : embed_read(c);
  Tensor tied_rows;  // a quantised token_embd tied to lm_head: f32 [V_r, H], packed below, then freed
  if (const TensorInfo& ei = ck.info(er.key); ei.quantized()) {
    MOE_CHECK(ei.shape == er.shape, "{}: {} has shape {}, the config says {}", dir, er.key, shape_str(ei.shape),
              shape_str(er.shape));
    const auto t = static_cast<gguf::GgmlType>(ei.ggml_type);
    m->embed_row_bytes_ = gguf::ggml_row_bytes(t, c.hidden_size);
    MOE_CHECK(ei.nbytes == static_cast<uint64_t>(c.vocab_size) * m->embed_row_bytes_,
              "{}: {} holds {} bytes, {} rows of {} {} weights need {}", dir, er.key, ei.nbytes, c.vocab_size,
              c.hidden_size, gguf::ggml_type_name(t), c.vocab_size * m->embed_row_bytes_);
    m->embed_ = ck.view_raw(er.key, m->vocab_.first * m->embed_row_bytes_, m->vocab_.second * m->embed_row_bytes_);
    m->embed_ggml_ = ei.ggml_type;
    if (c.tie_embeddings) tied_rows = load_sharded(ck, er);
  } else {
    m->embed_ = is_fp8_weight(ck, er.key) ? load_f32(ck, er) : load_sharded(ck, er);
  }
  m->final_norm_ = load_f32(ck, final_norm_read(c));
  LinearOptions lin(opt.quantize_linears ? DType::I8 : opt.dtype);
  lin.cache = cache.get();
  if (opt.quantize_linears_w4a8) lin.int4_group = opt.int4_group;
  // GGUF integer-coded linears stay in their codes unless int8 linears are asked for:
  // int4 reads 0.66 of int8's bytes at decode, but its GEMM is ~1.6x int8's time at
  // prefill (a float step per 32 inputs; docs/PERF.md), so --quantize-linears w8a8 is the
  // prefill-heavy choice.
  lin.keep_int4 = opt.gguf_q4_0_as_int4 && !opt.quantize_linears;
  // Vocabulary-parallel under --attn-tp: this rank's rows of lm_head only.
  if (const auto lm = m->attn_tp_ ? lm_head_read(c, m->vocab_) : lm_head_read(c))
    m->lm_head_ = load_linear(ck, *lm, lin);
  else  // tie_word_embeddings: packed from the view (this rank's rows), no f32 copy of [V, H]
    m->lm_head_ = make_linear(tied_rows.defined() ? tied_rows : m->embed_, lin);
  m->rope_ = Rope(c.rope);
  progress.advance(lb.outside);

  m->one_rank_placement_ = Placement::contiguous(c.moe.n_experts, 1, 1);
  m->layers_.resize(c.n_layers);
  m->expert_load_.assign(c.n_layers, {});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    DecoderLayer& L = m->layers_[l];
    L.input_norm = load_f32(ck, input_norm_read(c, l));
    L.post_norm = load_f32(ck, post_attn_norm_read(c, l));
    const AttentionKeys ak = fam.attention_keys(c, l);
    if (c.attention == AttentionKind::Mla)
      L.mla = std::make_unique<MlaAttention>(ck, c, ak, lin, attn_rank, attn);
    else
      L.gqa = std::make_unique<GqaAttention>(ck, c, ak, lin, attn_rank, attn);
    progress.advance(lb.layer[l]);
    if (!c.moe.is_moe_layer(l)) {
      MlpLoadOptions dl;
      dl.compute = opt.dtype;
      dl.gguf_q4_0_as_int4 = opt.gguf_q4_0_as_int4;  // an int4 (GPTQ, AWQ, ...) dense MLP
      dl.mlp_tp_rank = lo0.mlp_tp_rank;  // split over --attn-tp, summed in mlp()
      dl.mlp_tp_size = lo0.mlp_tp_size;
      dl.cache = cache.get();
      L.dense = load_dense_mlp(ck, c.moe, l, dl);
      progress.advance(lb.mlp[l]);
      continue;
    }
    m->expert_load_[l].assign(c.moe.n_experts, 0);
    MlpLoadOptions lo;
    lo.compute = opt.dtype;
    lo.quantize_w8a8 = opt.quantize_w8a8;
    lo.quantize_w4a8 = opt.quantize_w4a8;
    lo.int4_group = opt.int4_group;
    lo.gguf_q4_0_as_int4 = opt.gguf_q4_0_as_int4;
    lo.mlp_tp_rank = lo0.mlp_tp_rank;  // the shared experts, under --attn-tp
    lo.mlp_tp_size = lo0.mlp_tp_size;
    lo.progress = &progress;  // advanced by each expert packed
    lo.cache = cache.get();
    auto weights = [&] { return opt.moe_weights ? opt.moe_weights(l, lo) : load_moe_layer(ck, c.moe, l, lo); };
    if (!multi) {
      L.moe = std::make_unique<MoeLayer>(c.moe, weights());
    } else {
      Placement placement = placements.layer(l);
      lo.tp_rank = tp_rank;
      lo.tp_size = tp;
      MoeLayerWeights w = load_slot_weights(placement, m->groups_->ep_rank(), [&](int64_t b, int64_t e) {
        lo.expert_begin = b;
        lo.expert_end = e;
        return weights();
      });
      L.ep_moe = std::make_unique<EpMoeLayer>(MoeLayer(c.moe, std::move(w)), *opt.world, std::move(placement), ep_opt);
    }
    progress.advance(lb.mlp[l]);
  }
  progress.finish();
  if (cache) {
    m->cache_stats_.hits = cache->hits();
    m->cache_stats_.misses = cache->misses();
    m->cache_stats_.bytes_mapped = cache->bytes_mapped();
    // A cache that cannot be written (disk full, read-only directory) costs the next
    // start its speed, not this start its model.
    try {
      m->cache_stats_.bytes_written = cache->commit();
    } catch (const Error& e) {
      fmt::print(stderr, "moe-ep: warning: the weights cache was not written: {}\n", e.what());
    }
  }
  if (m->rank() == 0 && !m->layers_.empty() && m->layers_[0].gqa && m->layers_[0].gqa->unapplied_qs_scales())
    fmt::print(stderr,
               "moe-ep: note: the checkpoint's self_attn.q_matmul / s_matmul activation scales (FastDeploy's int8 "
               "Q.K^T and S.V) are checked but not applied: moe-ep computes attention scores and their sum over V "
               "in f32 (the int8 KV cache scales are applied)\n");
  if (eo.interval > 0) {
    m->opt_.count_experts = true;
    std::vector<EpMoeLayer*> eps;
    for (DecoderLayer& L : m->layers_) eps.push_back(L.ep_moe.get());
    m->eplb_ = std::make_unique<OnlineEplb>(eo, placements.params(), *opt.world, std::move(eps), m->expert_load_);
  }

  // KV cache, sized once.
  int64_t max_seq = opt.max_seq > 0 ? opt.max_seq : c.max_position;
  MOE_CHECK(max_seq > 0, "the KV cache needs a maximum sequence length (--max-seq-len)");
  MOE_CHECK(opt.n_slots >= 1, "the KV cache needs at least one sequence slot");
  if (c.sliding_window > 0)
    MOE_CHECK(max_seq <= c.sliding_window,
              "--max-seq-len {} exceeds the model's sliding_window {} (sliding-window attention is not supported)",
              max_seq, c.sliding_window);
  const bool mla = c.attention == AttentionKind::Mla;
  // GQA: this rank's KV heads only. MLA: the latent is every head's input, so each
  // attention-TP rank holds all of it (as vLLM does).
  const int64_t a_dim = mla ? c.kv_lora_rank : kv_heads_per_rank(c.n_kv_heads, attn) * c.head_dim;
  const int64_t b_dim = mla ? c.qk_rope_head_dim : kv_heads_per_rank(c.n_kv_heads, attn) * c.head_dim;
  KvCacheShape ks;
  ks.n_layers = c.n_layers;
  ks.n_slots = opt.n_slots;
  ks.max_seq = max_seq;
  ks.a_dim = a_dim;
  ks.b_dim = b_dim;
  ks.block_size = opt.kv_block_size;
  ks.dtype = opt.kv_cache_dtype;
  ks.a_tiled = !mla;  // GQA's K, read 16 positions per vector load by gqa_attend
  if (!mla) ks.b_heads = kv_heads_per_rank(c.n_kv_heads, attn);  // GQA's V, a run per KV head and block
  MOE_CHECK(ks.block_size >= 1 && ks.block_size <= 4096, "KV block size {} out of range [1, 4096]", ks.block_size);
  if (opt.paged_kv) {
    const uint64_t per_block = KvCacheShape::bytes_per_block(c.n_layers, ks.block_size, a_dim, b_dim, ks.dtype);
    const uint64_t full = per_block * ks.n_slots * ks.blocks_per_slot();
    const uint64_t want = opt.kv_cache_bytes > 0 ? opt.kv_cache_bytes : std::min(full, ModelOptions::kDefaultPagedKvBytes);
    ks.n_blocks = static_cast<int64_t>(std::min(want, full) / per_block);
    MOE_CHECK(ks.n_blocks >= 1, "a KV cache of {} bytes holds no block of {} positions ({} bytes each)", want,
              ks.block_size, per_block);
  }
  const uint64_t bytes = ks.bytes();
  MOE_CHECK(bytes < (uint64_t{1} << 40), "KV cache of {} blocks of {} positions would take {:.1f} GiB",
            ks.total_blocks(), ks.block_size, static_cast<double>(bytes) / (1 << 30));
  m->cache_ = KvCache(ks);
  return m;
}

void Model::mlp(DecoderLayer& L, int64_t l, const Tensor& x, float* y) {
  const int64_t T = x.dim(0), H = cfg_.hidden_size;
  if (L.dense) {
    run_gated_mlp(*L.dense, x, y, mlp_s_);
    if (attn_tp_ && T > 0) attn_tp_->all_reduce_sum(y, static_cast<size_t>(T * H));  // row-parallel down_proj
    return;
  }
  MoeLayer& local = L.moe ? *L.moe : L.ep_moe->local();
  // Expert load (count_experts) is counted from the routing the layer runs anyway when
  // that routing covers exactly this rank's x: one rank, own tokens (DP attention), or
  // allreduce or the slot gather (every rank routes all of x). forward_replicated's
  // sequence-parallel path routes only this rank's share of the rows, so there x is
  // routed once more to count its tokens.
  const bool routes_all_x = L.moe || (attn_tp_ ? L.ep_moe->attn_tp_routes_all(*attn_tp_)
                                               : opt_.par.dp > 1 || L.ep_moe->replicated_routes_all(T));
  const bool count = opt_.count_experts && T > 0;
  if (count && !routes_all_x) {
    Routing r;
    local.count_routed(expert_load_[l].data());
    local.route(x, r);
  }
  local.count_routed(count && routes_all_x ? expert_load_[l].data() : nullptr);
  if (L.moe) {
    // One rank: --moe-chunk-tokens bounds the layer's scratch (routing, permuted rows,
    // expert activations grow with the rows of a call) as it bounds the dispatch buffers
    // under EP. Every token's output depends only on its own row, so chunks change no bit.
    const int64_t chunk = opt_.ep.chunk_tokens;
    if (chunk > 0 && T > chunk) {
      for (int64_t b = 0; b < T; b += chunk) L.moe->forward(x.slice_rows(b, std::min(T, b + chunk)), y + b * H);
    } else {
      L.moe->forward(x, y);
    }
  } else {
    const Tensor out = attn_tp_          ? L.ep_moe->forward_attn_tp(x, *attn_tp_)  // same tokens in the group
                       : opt_.par.dp > 1 ? L.ep_moe->forward(x)                     // own tokens (DP attention)
                                         : L.ep_moe->forward_replicated(x);         // same tokens on every rank
    if (T > 0) std::memcpy(y, out.data<float>(), T * H * sizeof(float));
  }
  local.count_routed(nullptr);
}

namespace {

// t as f32 [rows, cols], reallocated only when the shape changes: the hidden-state
// buffers of a step keep their shape from one decode step to the next, so a decode
// step allocates none of them.
Tensor& step_buffer(Tensor& t, int64_t rows, int64_t cols) {
  if (!t.defined() || t.ndim() != 2 || t.dim(0) != rows || t.dim(1) != cols)
    t = Tensor::empty({rows, cols}, DType::F32);
  return t;
}

// h += d over n floats; a prompt's (4 MB at 512 x 2048) over the threads.
void add_residual(float* h, const float* d, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 2 * kRowParallelElems)
  for (int64_t i = 0; i < n; ++i) h[i] += d[i];
}

}  // namespace

EpStats Model::ep_stats() const {
  EpStats sum;
  for (const DecoderLayer& L : layers_) {
    if (!L.ep_moe) continue;
    const EpStats& s = L.ep_moe->stats();
    sum.total_s += s.total_s;
    sum.compute_s += s.compute_s;
    sum.shared_s += s.shared_s;
    sum.comm_wait_s += s.comm_wait_s;
    sum.bytes_sent += s.bytes_sent;
    sum.dispatch_bytes += s.dispatch_bytes;
    sum.rounds += s.rounds;
  }
  return sum;
}

Tensor Model::forward(const StepBatch& b) {
  const int64_t T = b.n_tokens(), H = cfg_.hidden_size, V = cfg_.vocab_size;
  MOE_CHECK(static_cast<int64_t>(b.positions.size()) == T, "internal: step has {} tokens but {} positions", T,
            b.positions.size());
  for (const SeqSpan& sp : b.seqs)
    MOE_CHECK(sp.slot >= 0 && sp.slot < cache_.n_slots() && sp.start_pos + sp.n <= cache_.capacity(sp.slot),
              "sequence in cache slot {} needs {} positions; the KV cache holds {} slots of at most {} positions, "
              "this slot {} now (raise --max-seq-len)",
              sp.slot, sp.start_pos + sp.n, cache_.n_slots(), cache_.max_seq(),
              sp.slot >= 0 && sp.slot < cache_.n_slots() ? cache_.capacity(sp.slot) : 0);
  float* hp = step_buffer(step_h_, T, H).data<float>();
  const size_t esz = dtype_size(embed_.dtype());
  for (int64_t t = 0; t < T; ++t)
    MOE_CHECK(b.tokens[t] >= 0 && b.tokens[t] < V, "token id {} is out of vocabulary (vocab_size {})", b.tokens[t],
              V);
  {
    prof::Scope ps(prof::kEmbed);
    // Rows of 2048 from a Q4_K/Q6_K table cost ~2 us each on one core: a prompt's go over the threads.
#pragma omp parallel for schedule(static) if (T > 1 && T * H >= kRowParallelElems)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = b.tokens[t];
      if (id < vocab_.first || id >= vocab_.second) {  // another rank's row (--attn-tp): summed below
        std::fill(hp + t * H, hp + (t + 1) * H, 0.f);
        continue;
      }
      const size_t row = static_cast<size_t>(id - vocab_.first);
      if (embed_ggml_ >= 0)
        gguf::dequantize_row(static_cast<gguf::GgmlType>(embed_ggml_),
                             static_cast<const char*>(embed_.raw()) + row * embed_row_bytes_, hp + t * H, H);
      else
        convert_to_f32(static_cast<const char*>(embed_.raw()) + row * H * esz, embed_.dtype(), hp + t * H, H);
    }
  }
  // Each row is one rank's values plus zeros: the sum is exact (a -0 embedding value
  // comes back +0, which changes no later value).
  if (attn_tp_ && T > 0) attn_tp_->all_reduce_sum(hp, static_cast<size_t>(T * H));
  rope_.tables(b.positions.data(), T, rope_tab_);
  const Tensor& xn = step_buffer(step_xn_, T, H);
  float* xp = step_xn_.data<float>();
  float* tp = step_buffer(step_tmp_, T, H).data<float>();
  AttnContext ctx;
  ctx.batch = &b;
  ctx.rope = &rope_tab_;
  ctx.cache = &cache_;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    DecoderLayer& L = layers_[l];
    ctx.layer = l;
    rms_norm(hp, L.input_norm.data<float>(), T, H, cfg_.rms_eps, xp);
    if (L.mla) L.mla->forward(ctx, xp, tp, attn_s_);
    else L.gqa->forward(ctx, xp, tp, attn_s_);
    if (tp_) tp_->all_reduce_sum(tp, static_cast<size_t>(T * H));  // row-parallel o_proj
    add_residual(hp, tp, T * H);
    rms_norm(hp, L.post_norm.data<float>(), T, H, cfg_.rms_eps, xp);
    mlp(L, l, xn, tp);
    add_residual(hp, tp, T * H);
  }
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  Tensor& last = step_buffer(step_last_, n, H);
  for (int64_t i = 0; i < n; ++i)
    rms_norm(hp + b.logit_rows[i] * H, final_norm_.data<float>(), 1, H, cfg_.rms_eps, last.data<float>() + i * H);
  Tensor logits = Tensor::empty({n, V}, DType::F32);
  {
    prof::Scope ps(prof::kLmHead);
    if (!attn_tp_)
      linear_forward(lm_head_, last.data<float>(), n, logits.data<float>(), lin_s_);
    else
      gather_vocab_logits(last.data<float>(), n, b.logit_top_k, logits.data<float>());
  }
  if (eplb_) eplb_->after_step(expert_load_);
  return logits;
}

void Model::gather_vocab_logits(const float* x, int64_t n, const std::vector<int32_t>& top_k, float* logits) {
  // One all-gather: rank r's part is, row after row, either its whole [V_r] slice (f32)
  // or, for a row whose caller reads only its k best, its min(k, V_r) best (value, id)
  // pairs in sampler.h's order. The k best of the row are among the ranks' k bests.
  const int R = attn_tp_->size(), me = attn_tp_->rank();
  const int64_t V = cfg_.vocab_size, Vr = vocab_.second - vocab_.first;
  MOE_CHECK(top_k.empty() || static_cast<int64_t>(top_k.size()) == n, "internal: {} top-k limits for {} logit rows",
            top_k.size(), n);
  Tensor& mine = step_buffer(step_vocab_, n, std::max<int64_t>(Vr, 1));
  if (Vr > 0) linear_forward(lm_head_, x, n, mine.data<float>(), lin_s_);
  // Pairs only where they are smaller than the slice on every rank (every rank decides
  // alike: the smallest slice is rank 0's, V / R rounded down).
  std::vector<int64_t> k(n, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(top_k.size()); ++i)
    if (top_k[i] > 0 && 2 * static_cast<int64_t>(top_k[i]) < V / R) k[i] = top_k[i];
  struct Pair {
    float v;
    int32_t id;
  };
  static_assert(sizeof(Pair) == 8);
  auto part_bytes = [&](int64_t slice) {
    size_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += k[i] > 0 ? std::min(k[i], slice) * sizeof(Pair) : slice * sizeof(float);
    return s;
  };
  std::vector<size_t> bytes(R);
  for (int r = 0; r < R; ++r) {
    const auto [b, e] = vocab_range(V, r, R);
    bytes[r] = part_bytes(e - b);
  }
  vocab_send_.resize(bytes[me]);
  char* out = vocab_send_.data();
  std::vector<int32_t>& order = vocab_order_;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = mine.data<float>() + i * Vr;
    if (k[i] == 0) {
      std::memcpy(out, row, Vr * sizeof(float));
      out += Vr * sizeof(float);
      continue;
    }
    const int64_t kk = std::min(k[i], Vr);
    order.resize(Vr);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + kk, order.end(),
                      [&](int32_t a, int32_t c) { return logit_before(row, a, c); });
    for (int64_t j = 0; j < kk; ++j, out += sizeof(Pair)) {
      const Pair p{row[order[j]], static_cast<int32_t>(vocab_.first + order[j])};
      std::memcpy(out, &p, sizeof p);
    }
  }
  size_t total = 0;
  for (size_t s : bytes) total += s;
  vocab_gather_.resize(total);
  attn_tp_->all_gather_v(vocab_send_.data(), bytes[me], vocab_gather_.data(), bytes);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (k[i] > 0) std::fill(logits + i * V, logits + (i + 1) * V, kNegInf);
  const char* in = vocab_gather_.data();
  for (int r = 0; r < R; ++r) {
    const auto [b, e] = vocab_range(V, r, R);
    for (int64_t i = 0; i < n; ++i) {
      if (k[i] == 0) {
        std::memcpy(logits + i * V + b, in, (e - b) * sizeof(float));
        in += (e - b) * sizeof(float);
        continue;
      }
      // Every rank's k best land at their ids. The row's k best are among them and
      // rank before the others (which are true logits too), so the first k of the
      // row in sampler.h's order are the whole row's.
      for (int64_t j = 0; j < std::min(k[i], e - b); ++j, in += sizeof(Pair)) {
        Pair p;
        std::memcpy(&p, in, sizeof p);
        MOE_CHECK(p.id >= b && p.id < e, "internal: rank {} sent vocabulary id {} outside its rows [{}, {})", r, p.id,
                  b, e);
        logits[i * V + p.id] = p.v;
      }
    }
  }
}

void Model::reset_expert_load() {
  for (auto& row : expert_load_) std::fill(row.begin(), row.end(), 0);
  if (eplb_) eplb_->counters_reset(expert_load_);
}

const Placement& Model::placement(int64_t l) const {
  MOE_CHECK(l >= 0 && l < cfg_.n_layers && cfg_.moe.is_moe_layer(l), "layer {} is not a MoE layer", l);
  return layers_[l].ep_moe ? layers_[l].ep_moe->placement() : one_rank_placement_;
}

}  // namespace moe
