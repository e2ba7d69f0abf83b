// The decode path of EpMoeLayer::forward_replicated for the all-to-all strategies
// (every rank holds the same T tokens, T <= --max-tokens-per-rank, tp = 1):
//   route   : every rank routes all T tokens, picking replicas by token index alone,
//             so all ranks agree on which slot computes each (token, k) choice
//   experts : each rank computes the choices whose slot it holds, from its own copy
//             of x (no dispatch: the tokens are already everywhere)
//   gather  : one all-gather-v of those per-choice outputs (every rank knows every
//             rank's count from the shared routing: no layout round)
//   combine : every rank sums each token's k outputs in slot order j = 0..k-1
// One collective per MoE layer instead of three (dispatch, combine, and the
// all-gather of the rows' outputs), and the same bits as one rank: the kernel is
// batch-invariant and the sum order is the single-rank layer's.
#include <cstring>

#include "core/check.h"
#include "moe/dispatch/common.h"

namespace moe {
namespace {

class SlotGather final : public MoeStrategy {
 public:
  explicit SlotGather(EpMoeLayer& ep) : ep_(ep) {}

  void forward(const Tensor& x, float* y, EpStats& st) override {
    using dispatch::ScopedTimer;
    MoeLayer& layer = ep_.local();
    Communicator& comm = ep_.comm();
    const Placement& pl = ep_.placement();
    const int R = comm.size(), me = comm.rank();
    MOE_CHECK(pl.tp() == 1, "internal: the slot gather runs without MoE-TP");
    const int64_t T = x.dim(0), H = layer.config().hidden_size, k = layer.config().top_k;
    const size_t row_bytes = layer.act_row_bytes();
    from_.assign(R, 0);
    {
      ScopedTimer timer(st.compute_s);
      layer.set_salt_offset(0);  // the same picks on every rank
      layer.route(x, routing_);
      layer.set_salt_offset(me);
      rows_.resize(static_cast<size_t>(T) * row_bytes);
      dispatch::token_rows(layer, x, rows_.data());
      items_.clear();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t s = routing_.ids[t * k + j];
          const int d = pl.owner(s);
          ++from_[d];
          if (d != me) continue;
          items_.rows.push_back(rows_.data() + t * row_bytes);
          items_.local_expert.push_back(static_cast<int32_t>(pl.local_index(s)));
        }
      out_ = MoeScratch::ensure(out_, static_cast<int64_t>(items_.rows.size()), H, DType::F32);
      st.rows += static_cast<int64_t>(items_.rows.size());
      dispatch::run_local_items(layer, items_, out_.data<float>());
    }
    // The shared experts of all T tokens run on the side thread during the gather.
    shared_.start_then_wait(layer, x, ep_.options(), st, nullptr);
    bytes_.resize(R);
    for (int d = 0; d < R; ++d) bytes_[d] = static_cast<size_t>(from_[d]) * H * sizeof(float);
    all_ = MoeScratch::ensure(all_, T * k, H, DType::F32);
    {
      ScopedTimer timer(st.comm_wait_s);
      comm.all_gather_v(out_.raw(), bytes_[me], all_.raw(), bytes_);
    }
    st.bytes_sent += static_cast<double>(bytes_[me]) * (R - 1);
    {
      ScopedTimer timer(st.compute_s);
      parts_.assign(T * k, nullptr);
      const float* p = all_.data<float>();
      for (int d = 0; d < R; ++d)
        for (int64_t i = 0; i < T * k; ++i)
          if (pl.owner(routing_.ids[i]) == d) {
            parts_[i] = p;
            p += H;
          }
      dispatch::combine_slots(routing_.weights.data(), T, k, 1, parts_, H, y);
    }
    shared_.add_to(y);
  }

 private:
  EpMoeLayer& ep_;
  Routing routing_;
  std::vector<char> rows_;
  std::vector<int64_t> from_;
  std::vector<size_t> bytes_;
  dispatch::LocalItems items_;
  std::vector<const float*> parts_;
  Tensor out_, all_;
  dispatch::SharedRun shared_;
};

}  // namespace

std::unique_ptr<MoeStrategy> make_slot_gather(EpMoeLayer& ep) { return std::make_unique<SlotGather>(ep); }

}  // namespace moe
