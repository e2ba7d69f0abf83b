// Strategy `alltoall` (DeepEP "normal" mode): each rank holds its own tokens.
//   layout   : per destination rank, how many tokens go there (one small all-to-all)
//   dispatch : each token goes ONCE to each rank serving one of its experts, as a
//              record [k expert ids, -1 where the slot is not that rank's][row]
//   experts  : the receiver runs every (record, slot) for its experts
//   combine  : per-slot outputs return to the source in the order it sent them; the
//              source sums the k slots in slot order (MoE-TP partials in rank order)
// W8A8: rows travel as Q8 rows (int8 + an f32 scale tail: about a quarter of f32, half
// of bf16); with per-expert smooth vectors a token is sent once per (token, slot) as a
// record whose other ids are -1, quantised for that slot's expert.
// The shared experts run while the dispatch is in flight. With tp = 1 the output is
// bitwise identical to the single-rank layer for any EP size.
#include <cstring>

#include "core/check.h"
#include "moe/dispatch/common.h"

namespace moe {
namespace {

class AllToAll final : public MoeStrategy {
 public:
  explicit AllToAll(EpMoeLayer& ep) : ep_(ep) {}

  void forward(const Tensor& x, float* y, EpStats& st) override {
    using dispatch::ScopedTimer;
    MoeLayer& layer = ep_.local();
    Communicator& comm = ep_.comm();
    const Placement& pl = ep_.placement();
    const int R = comm.size(), me = comm.rank(), tp = pl.tp();
    const int64_t T = x.dim(0), H = layer.config().hidden_size, k = layer.config().top_k;
    const size_t row_bytes = layer.act_row_bytes();
    const size_t rec = k * sizeof(int32_t) + row_bytes;
    const bool per_slot = layer.quantized() && !layer.smooth_uniform();
    const int64_t my_begin = layer.weights().expert_begin;

    // ---- layout: which ranks each token goes to, and how many slots each serves.
    std::vector<size_t> n_send(R, 0), slots_to(R, 0);
    {
      ScopedTimer timer(st.compute_s);
      layer.route(x, routing_);
      if (!per_slot) {
        rows_.resize(static_cast<size_t>(T) * row_bytes);
        dispatch::token_rows(layer, x, rows_.data());
      }
      dest_.assign(T * R, 0);  // dest_[t*R + d]: token t goes to rank d
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int first = pl.first_rank(routing_.ids[t * k + j]);
          for (int q = 0; q < tp; ++q) {
            ++slots_to[first + q];
            if (per_slot) {
              dest_[t * R + first + q] = 1;
              ++n_send[first + q];
            } else if (!dest_[t * R + first + q]) {
              dest_[t * R + first + q] = 1;
              ++n_send[first + q];
            }
          }
        }
    }
    std::vector<size_t> n_recv(R);
    {
      ScopedTimer timer(st.comm_wait_s);
      std::vector<size_t> eight(R, sizeof(size_t)), off(R);
      for (int r = 0; r < R; ++r) off[r] = r * sizeof(size_t);
      comm.all_to_all_v(n_send.data(), eight, off, n_recv.data(), eight, off);
    }

    // ---- dispatch: pack records by destination, exchange nonblocking.
    std::vector<size_t> sb(R), so(R), rb(R), ro(R);
    size_t send_total = 0, recv_total = 0;
    for (int r = 0; r < R; ++r) {
      sb[r] = n_send[r] * rec;
      so[r] = send_total;
      send_total += sb[r];
      rb[r] = n_recv[r] * rec;
      ro[r] = recv_total;
      recv_total += rb[r];
    }
    {
      ScopedTimer timer(st.compute_s);
      send_.resize(send_total);
      std::vector<size_t> cursor(so);
      for (int d = 0; d < R; ++d) {
        for (int64_t t = 0; t < T; ++t) {
          if (!dest_[t * R + d]) continue;
          if (per_slot) {  // one record per slot served by d, in slot order
            for (int64_t j = 0; j < k; ++j) {
              const int32_t e = routing_.ids[t * k + j];
              const int first = pl.first_rank(e);
              if (d < first || d >= first + tp) continue;
              char* r = send_.data() + cursor[d];
              cursor[d] += rec;
              int32_t* ids = reinterpret_cast<int32_t*>(r);
              for (int64_t i = 0; i < k; ++i) ids[i] = i == j ? e : -1;
              layer.quantize_for_expert(static_cast<const char*>(x.raw()) + t * H * dtype_size(x.dtype()), x.dtype(),
                                        e, r + k * sizeof(int32_t));
            }
            continue;
          }
          char* r = send_.data() + cursor[d];
          cursor[d] += rec;
          int32_t* ids = reinterpret_cast<int32_t*>(r);
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = routing_.ids[t * k + j];
            const int first = pl.first_rank(e);
            ids[j] = (d >= first && d < first + tp) ? e : -1;
          }
          std::memcpy(r + k * sizeof(int32_t), rows_.data() + t * row_bytes, row_bytes);
        }
      }
    }
    recv_.resize(recv_total);
    auto req = comm.iall_to_all_v(send_.data(), sb, so, recv_.data(), rb, ro);
    for (int r = 0; r < R; ++r)
      if (r != me) {
        st.bytes_sent += static_cast<double>(sb[r]);
        st.dispatch_bytes += static_cast<double>(sb[r]);
      }
    shared_.start_then_wait(layer, x, ep_.options(), st, req.get());

    // ---- experts: every (record, slot) of this rank's experts, in arrival order.
    std::vector<size_t> items_from(R, 0);
    {
      ScopedTimer timer(st.compute_s);
      items_.clear();
      for (int s = 0; s < R; ++s)
        for (size_t i = 0; i < n_recv[s]; ++i) {
          const char* r = recv_.data() + ro[s] + i * rec;
          int32_t ids[64];
          MOE_CHECK(k <= 64, "top_k {} above 64 is not supported by alltoall", k);
          std::memcpy(ids, r, k * sizeof(int32_t));
          for (int64_t j = 0; j < k; ++j) {
            if (ids[j] < 0) continue;
            MOE_DCHECK(ids[j] >= my_begin && ids[j] < layer.weights().expert_end);
            items_.rows.push_back(r + k * sizeof(int32_t));
            items_.local_expert.push_back(ids[j] - static_cast<int32_t>(my_begin));
            ++items_from[s];
          }
        }
      out_ = MoeScratch::ensure(out_, static_cast<int64_t>(items_.rows.size()), H, DType::F32);
      st.rows += static_cast<int64_t>(items_.rows.size());
      dispatch::run_local_items(layer, items_, out_.data<float>());
    }

    // ---- combine: outputs go back to their sources, in the order they came.
    std::vector<size_t> cb(R), co(R), crb(R), cro(R);
    size_t back_total = 0, ret_total = 0;
    for (int r = 0; r < R; ++r) {
      cb[r] = items_from[r] * H * sizeof(float);
      co[r] = back_total;
      back_total += cb[r];
      crb[r] = slots_to[r] * H * sizeof(float);
      cro[r] = ret_total;
      ret_total += crb[r];
    }
    ret_ = MoeScratch::ensure(ret_, static_cast<int64_t>(ret_total / sizeof(float)), 1, DType::F32);
    {
      ScopedTimer timer(st.comm_wait_s);
      comm.all_to_all_v(out_.raw(), cb, co, ret_.raw(), crb, cro);
    }
    for (int r = 0; r < R; ++r)
      if (r != me) st.bytes_sent += static_cast<double>(cb[r]);
    {
      ScopedTimer timer(st.compute_s);
      parts_.assign(T * k * tp, nullptr);
      for (int d = 0; d < R; ++d) {
        const float* p = ret_.data<float>() + cro[d] / sizeof(float);
        for (int64_t t = 0; t < T; ++t) {
          if (!dest_[t * R + d]) continue;
          for (int64_t j = 0; j < k; ++j) {
            const int first = pl.first_rank(routing_.ids[t * k + j]);
            if (d < first || d >= first + tp) continue;
            parts_[(t * k + j) * tp + (d - first)] = p;
            p += H;
          }
        }
      }
      dispatch::combine_slots(routing_.weights.data(), T, k, tp, parts_, H, y);
    }
    shared_.add_to(y);
  }

 private:
  EpMoeLayer& ep_;
  Routing routing_;
  std::vector<char> dest_, rows_, send_, recv_;
  dispatch::LocalItems items_;
  std::vector<const float*> parts_;
  Tensor out_, ret_;
  dispatch::SharedRun shared_;
};

}  // namespace

std::unique_ptr<MoeStrategy> make_alltoall(EpMoeLayer& ep) { return std::make_unique<AllToAll>(ep); }

}  // namespace moe
