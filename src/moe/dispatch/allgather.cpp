// Strategy `allgather` (DP attention): each rank holds its own tokens, counts may
// differ and be 0. Each rank routes its tokens, then every rank gathers all ranks'
// tokens with their routing (one all-gather-v of packed records), computes its own
// experts' slots over all of them, combines a partial output for every token, and
// a reduce-scatter-v returns each rank the sum for its own tokens. The shared
// experts run on the rank's own tokens while the gather is in flight.
#include <cstring>

#include "moe/dispatch/common.h"

namespace moe {
namespace {

class AllGather final : public MoeStrategy {
 public:
  explicit AllGather(EpMoeLayer& ep) : ep_(ep) {}

  void forward(const Tensor& x, float* y, EpStats& st) override {
    using dispatch::ScopedTimer;
    MoeLayer& layer = ep_.local();
    Communicator& comm = ep_.comm();
    const int R = comm.size();
    const int64_t T = x.dim(0), H = layer.config().hidden_size, k = layer.config().top_k;
    // W8A8 layers quantise in routed_partial (per expert smooth): gather f32 rows.
    const DType ct = layer.quantized() ? DType::F32 : layer.compute_dtype();
    const size_t row_bytes = static_cast<size_t>(H) * dtype_size(ct);
    // Record: k int32 expert ids, k f32 weights, the row in the compute dtype.
    const size_t rec = k * 8 + row_bytes;

    std::vector<int64_t> counts(R);
    {
      ScopedTimer timer(st.comm_wait_s);
      comm.all_gather(&T, sizeof(int64_t), counts.data());
    }
    int64_t T_all = 0;
    std::vector<int64_t> first(R + 1, 0);
    for (int r = 0; r < R; ++r) first[r + 1] = first[r] + counts[r];
    T_all = first[R];

    {
      ScopedTimer timer(st.compute_s);
      layer.route(x, routing_);
      send_.resize(T * rec);
      rows_.resize(static_cast<size_t>(T) * row_bytes);
      dispatch::convert_rows(x, ct, rows_.data());
      for (int64_t t = 0; t < T; ++t) {
        char* r = send_.data() + t * rec;
        std::memcpy(r, &routing_.ids[t * k], k * 4);
        std::memcpy(r + k * 4, &routing_.weights[t * k], k * 4);
        std::memcpy(r + k * 8, rows_.data() + t * row_bytes, row_bytes);
      }
    }
    // all_gather_v as an all-to-all that sends the same block to every rank, so it
    // can run nonblocking while the shared experts compute.
    recv_.resize(T_all * rec);
    std::vector<size_t> sb(R, T * rec), so(R, 0), rb(R), ro(R);
    for (int r = 0; r < R; ++r) {
      rb[r] = counts[r] * rec;
      ro[r] = first[r] * rec;
    }
    auto req = comm.iall_to_all_v(send_.data(), sb, so, recv_.data(), rb, ro);
    st.bytes_sent += static_cast<double>(T * rec) * (R - 1);
    shared_.start_then_wait(layer, x, ep_.options(), st, req.get());

    {
      ScopedTimer timer(st.compute_s);
      all_.ids.resize(T_all * k);
      all_.weights.resize(T_all * k);
      gathered_ = MoeScratch::ensure(gathered_, T_all, H, ct);
      char* g = static_cast<char*>(gathered_.raw());
      for (int64_t t = 0; t < T_all; ++t) {
        const char* r = recv_.data() + t * rec;
        std::memcpy(&all_.ids[t * k], r, k * 4);
        std::memcpy(&all_.weights[t * k], r + k * 4, k * 4);
        std::memcpy(g + t * row_bytes, r + k * 8, row_bytes);
      }
      gen_idx(all_.ids.data(), T_all, k, layer.n_slots(), all_.index);
      partial_ = MoeScratch::ensure(partial_, T_all, H, DType::F32);
      st.rows += all_.index.rows_in(layer.weights().expert_begin, layer.weights().expert_end);
      layer.routed_partial(gathered_.slice_rows(0, T_all * H).reshape({T_all, H}), all_, partial_.data<float>());
    }
    {
      ScopedTimer timer(st.comm_wait_s);
      std::vector<size_t> n(R);
      for (int r = 0; r < R; ++r) n[r] = counts[r] * H;
      comm.reduce_scatter_v_sum(partial_.data<float>(), y, n);
      st.bytes_sent += static_cast<double>(T_all - T) * H * sizeof(float);
    }
    shared_.add_to(y);
  }

 private:
  EpMoeLayer& ep_;
  Routing routing_;
  Routing all_;  // the routing of every rank's tokens, gathered
  std::vector<char> send_, recv_, rows_;
  Tensor gathered_, partial_;
  dispatch::SharedRun shared_;
};

}  // namespace

std::unique_ptr<MoeStrategy> make_allgather(EpMoeLayer& ep) { return std::make_unique<AllGather>(ep); }

}  // namespace moe
