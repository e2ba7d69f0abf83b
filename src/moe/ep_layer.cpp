#include "moe/ep_layer.h"

#include <algorithm>

#include "core/check.h"
#include "moe/dispatch/common.h"
#include "moe/rebalance.h"

namespace moe {

namespace {

// Rows [T*i/G, T*(i+1)/G) of T: rank i's even share in a group of G (sequence parallel).
std::pair<int64_t, int64_t> even_share(int64_t T, int i, int G) { return {T * i / G, T * (i + 1) / G}; }

// Gathers every rank's share of y [T, H] f32 (`own`: this rank's rows) into `y`, in
// rank order; the wait counts as communication.
void gather_shares(Communicator& comm, const Tensor& own, int64_t T, int64_t H, Tensor& y, EpStats& stats) {
  const int G = comm.size();
  std::vector<size_t> bytes(G);
  for (int i = 0; i < G; ++i) {
    const auto [b, e] = even_share(T, i, G);
    bytes[i] = static_cast<size_t>((e - b) * H) * sizeof(float);
  }
  dispatch::ScopedTimer timer(stats.comm_wait_s);
  comm.all_gather_v(own.raw(), own.nbytes(), y.raw(), bytes);
}

}  // namespace

MoeComm parse_moe_comm(const std::string& s) {
  if (s == "allreduce") return MoeComm::AllReduce;
  if (s == "allgather") return MoeComm::AllGather;
  if (s == "alltoall") return MoeComm::AllToAll;
  if (s == "alltoall-ll") return MoeComm::AllToAllLL;
  if (s == "auto") return MoeComm::Auto;
  MOE_FAIL("unknown --moe-comm '{}': expected allreduce, allgather, alltoall, alltoall-ll or auto", s);
}

const char* moe_comm_name(MoeComm c) {
  switch (c) {
    case MoeComm::AllReduce: return "allreduce";
    case MoeComm::AllGather: return "allgather";
    case MoeComm::AllToAll: return "alltoall";
    case MoeComm::AllToAllLL: return "alltoall-ll";
    case MoeComm::Auto: return "auto";
  }
  return "?";
}

EpMoeLayer::EpMoeLayer(MoeLayer layer, Communicator& world, Placement placement, EpOptions opt)
    : layer_(std::move(layer)), world_(world), placement_(std::move(placement)), opt_(opt) {
  const int R = world_.size();
  MOE_CHECK(placement_.ep() * placement_.tp() == R, "placement is for ep={} x tp={} = {} ranks, the job has {}",
            placement_.ep(), placement_.tp(), placement_.ep() * placement_.tp(), R);
  MOE_CHECK(placement_.n_experts() == layer_.config().n_experts, "placement covers {} experts, the layer has {}",
            placement_.n_experts(), layer_.config().n_experts);
  const int ep_rank = world_.rank() / placement_.tp();
  MOE_CHECK(layer_.weights().expert_begin == placement_.begin(ep_rank) &&
                layer_.weights().expert_end == placement_.end(ep_rank),
            "rank {} holds expert slots [{}, {}) but the placement gives it [{}, {})", world_.rank(),
            layer_.weights().expert_begin, layer_.weights().expert_end, placement_.begin(ep_rank),
            placement_.end(ep_rank));
  MOE_CHECK(opt_.max_tokens_per_rank >= 1, "--max-tokens-per-rank must be at least 1");
  MOE_CHECK(opt_.chunk_tokens >= 0, "--moe-chunk-tokens must not be negative");
  attach_placement();
}

EpMoeLayer::~EpMoeLayer() = default;

void EpMoeLayer::attach_placement() {
  // allreduce: every rank routes the same tokens and must pick the same replicas, so
  // the salt is the token index alone; the other strategies route each rank's own
  // tokens, and the rank offset spreads the ranks' first tokens over the replicas.
  const int64_t salt = opt_.comm == MoeComm::AllReduce ? 0 : world_.rank();
  layer_.set_placement(&placement_, salt);
}

MoeComm EpMoeLayer::resolve(int64_t max_tokens) const {
  if (opt_.comm != MoeComm::Auto) return opt_.comm;
  // Decode-sized calls fit the fixed low-latency buffers and save the layout round;
  // anything larger takes the normal all-to-all, whose buffers size to the call.
  return max_tokens <= opt_.max_tokens_per_rank ? MoeComm::AllToAllLL : MoeComm::AllToAll;
}

MoeStrategy& EpMoeLayer::strategy(MoeComm c) {
  auto& s = strategies_[static_cast<int>(c)];
  if (!s) {
    switch (c) {
      case MoeComm::AllReduce: s = make_allreduce(*this); break;
      case MoeComm::AllGather: s = make_allgather(*this); break;
      case MoeComm::AllToAll: s = make_alltoall(*this); break;
      case MoeComm::AllToAllLL: s = make_alltoall_ll(*this); break;
      case MoeComm::Auto: MOE_FAIL("internal: unresolved strategy");
    }
  }
  return *s;
}

Tensor EpMoeLayer::forward(const Tensor& x) { return forward_counts(x, nullptr); }

Tensor EpMoeLayer::forward_counts(const Tensor& x, const std::vector<int64_t>* known) {
  const int64_t H = layer_.config().hidden_size;
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == H && x.is_contiguous(),
            "MoE input 'hidden_states' has shape {}, expected [T, {}]", shape_str(x.shape()), H);
  stats_.reset();
  const double t0 = now_s();
  const int R = world_.size();
  const int64_t T = x.dim(0);

  // Every rank's token count sizes the chunk rounds (identical on all ranks), resolves
  // `auto` identically everywhere, and lets every rank reject an alltoall-ll overflow
  // together instead of hanging. Unless the caller knows them (forward_replicated:
  // even shares of the same T everywhere), one small collective per call finds them.
  if (!known) {
    gathered_counts_.resize(R);
    dispatch::ScopedTimer timer(stats_.comm_wait_s);
    world_.all_gather(&T, sizeof T, gathered_counts_.data());
  }
  const std::vector<int64_t>& counts = known ? *known : gathered_counts_;
  MOE_CHECK(static_cast<int>(counts.size()) == R && counts[world_.rank()] == T,
            "internal: token counts of the ranks do not match this rank's {} tokens", T);
  const int64_t max_T = *std::max_element(counts.begin(), counts.end());
  const int64_t chunk = opt_.chunk_tokens > 0 ? opt_.chunk_tokens : std::max<int64_t>(max_T, 1);
  const MoeComm c = resolve(std::min(chunk, max_T));
  stats_.used = c;
  if (c == MoeComm::AllReduce)
    for (int r = 0; r < R; ++r)
      MOE_CHECK(counts[r] == T, "--moe-comm allreduce needs the same tokens on every rank: rank {} has {}, rank {} has {}",
                world_.rank(), T, r, counts[r]);
  if (c == MoeComm::AllToAllLL)
    for (int r = 0; r < R; ++r)
      MOE_CHECK(std::min(counts[r], chunk) <= opt_.max_tokens_per_rank,
                "--moe-comm alltoall-ll: rank {} holds {} tokens per call, more than --max-tokens-per-rank {} "
                "(raise it, set --moe-chunk-tokens, or use alltoall)",
                r, std::min(counts[r], chunk), opt_.max_tokens_per_rank);

  Tensor y = Tensor::zeros({T, H}, DType::F32);
  const int64_t rounds = std::max<int64_t>(1, (max_T + chunk - 1) / chunk);
  MoeStrategy& s = strategy(c);
  for (int64_t i = 0; i < rounds; ++i) {
    const int64_t b = std::min(T, i * chunk), e = std::min(T, (i + 1) * chunk);
    s.forward(x.slice_rows(b, e), y.data<float>() + b * H, stats_);
  }
  stats_.rounds = rounds;
  stats_.total_s = now_s() - t0;
  return y;
}

bool EpMoeLayer::slot_gather_applies(int64_t T) const {
  const bool a2a = opt_.comm == MoeComm::Auto || opt_.comm == MoeComm::AllToAll || opt_.comm == MoeComm::AllToAllLL;
  const bool per_slot = layer_.quantized() && !layer_.smooth_uniform();
  return world_.size() > 1 && a2a && placement_.tp() == 1 && !per_slot && T <= opt_.max_tokens_per_rank &&
         (opt_.chunk_tokens == 0 || T <= opt_.chunk_tokens);
}

Tensor EpMoeLayer::forward_attn_tp(const Tensor& x, Communicator& group) {
  if (attn_tp_routes_all(group)) return forward_replicated(x);
  const int G = group.size();
  const int64_t T = x.dim(0), H = layer_.config().hidden_size;
  const auto [b, e] = even_share(T, group.rank(), G);
  Tensor y_own = forward(x.slice_rows(b, e));  // the strategies skip the shared slices
  if (layer_.weights().shared.has_value()) {
    // This rank's slice of the shared experts on every row, summed over the group onto
    // each rank's share of the rows.
    shared_all_ = MoeScratch::ensure(shared_all_, std::max<int64_t>(T, 1), H, DType::F32);
    {
      dispatch::ScopedTimer timer(stats_.shared_s);
      if (T > 0) layer_.shared_experts(x, shared_all_.data<float>(), /*accumulate=*/false);
    }
    dispatch::ScopedTimer timer(stats_.comm_wait_s);
    std::vector<size_t> counts(G);
    for (int i = 0; i < G; ++i) {
      const auto [bi, ei] = even_share(T, i, G);
      counts[i] = static_cast<size_t>((ei - bi) * H);
    }
    shared_own_ = MoeScratch::ensure(shared_own_, std::max<int64_t>(e - b, 1), H, DType::F32);
    group.reduce_scatter_v_sum(shared_all_.data<float>(), shared_own_.data<float>(), counts);
    float* yo = y_own.data<float>();
    const float* so = shared_own_.data<float>();
    for (int64_t i = 0; i < (e - b) * H; ++i) yo[i] += so[i];
  }
  Tensor y = Tensor::empty({T, H}, DType::F32);
  gather_shares(group, y_own, T, H, y, stats_);
  return y;
}

Tensor EpMoeLayer::forward_replicated(const Tensor& x) {
  const int R = world_.size(), r = world_.rank();
  const int64_t T = x.dim(0), H = layer_.config().hidden_size;
  if (R == 1) return forward(x);
  if (opt_.comm == MoeComm::AllReduce) {
    replicated_counts_.assign(R, T);
    return forward_counts(x, &replicated_counts_);
  }
  if (slot_gather_applies(T)) {
    stats_.reset();
    const double t0 = now_s();
    Tensor y = Tensor::zeros({T, H}, DType::F32);
    if (T > 0) {
      if (!slot_gather_) slot_gather_ = make_slot_gather(*this);
      slot_gather_->forward(x, y.data<float>(), stats_);
    }
    stats_.used = resolve(T);
    stats_.rounds = 1;
    stats_.total_s = now_s() - t0;
    return y;
  }
  const auto [b, e] = even_share(T, r, R);
  // Every rank holds the same T, so every rank's share is known here: no count round.
  std::vector<int64_t>& counts = replicated_counts_;
  counts.resize(R);
  for (int i = 0; i < R; ++i) counts[i] = even_share(T, i, R).second - even_share(T, i, R).first;
  const Tensor y_local = forward_counts(x.slice_rows(b, e), &counts);
  Tensor y = Tensor::empty({T, H}, DType::F32);
  gather_shares(world_, y_local, T, H, y, stats_);
  return y;
}

}  // namespace moe
