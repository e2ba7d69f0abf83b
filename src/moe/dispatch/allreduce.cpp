// Strategy `allreduce`: every rank holds the same tokens (TP attention). Each rank
// routes them (the same way everywhere), gathers only the rows of its own experts
// (a ragged gather: no masked zero-weight rows), computes them, combines its
// partial output and sums the partials over all ranks in one all-reduce. The shared
// experts run while the all-reduce is in flight, or, when each rank holds a slice of
// them (EpOptions::shared_partial, --attn-tp), join the partial before it: the seed's
// one all-reduce of routed + shared outputs.
#include <cstring>

#include "moe/dispatch/common.h"

namespace moe {
namespace {

class AllReduce final : public MoeStrategy {
 public:
  explicit AllReduce(EpMoeLayer& ep) : ep_(ep) {}

  void forward(const Tensor& x, float* y, EpStats& st) override {
    using dispatch::ScopedTimer;
    MoeLayer& layer = ep_.local();
    const int64_t T = x.dim(0), H = layer.config().hidden_size;
    {
      ScopedTimer timer(st.compute_s);
      layer.route(x, routing_);
      st.rows += routing_.index.rows_in(layer.weights().expert_begin, layer.weights().expert_end);
      layer.routed_partial(x, routing_, y);
    }
    if (ep_.options().shared_partial) {  // this rank's slice joins the partial (SharedRun skips it)
      ScopedTimer timer(st.shared_s);
      layer.shared_experts(x, y, /*accumulate=*/true);
    }
    std::unique_ptr<CommRequest> req;
    if (T > 0) req = ep_.comm().iall_reduce_sum(y, static_cast<size_t>(T * H));
    st.bytes_sent += static_cast<double>(T * H * sizeof(float)) * (ep_.comm().size() > 1);
    shared_.start_then_wait(layer, x, ep_.options(), st, req.get());
    shared_.add_to(y);
  }

 private:
  EpMoeLayer& ep_;
  Routing routing_;
  dispatch::SharedRun shared_;
};

}  // namespace

std::unique_ptr<MoeStrategy> make_allreduce(EpMoeLayer& ep) { return std::make_unique<AllReduce>(ep); }

}  // namespace moe
