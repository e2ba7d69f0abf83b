// Pieces shared by the EP strategies (moe/dispatch/*.cpp). Internal header.
#pragma once

#include <cstdint>
#include <vector>

#include "core/clock.h"
#include "moe/ep_layer.h"

namespace moe::dispatch {

// Adds the time spent in its scope to `acc`.
class ScopedTimer {
 public:
  explicit ScopedTimer(double& acc) : acc_(acc), t0_(now_s()) {}
  ~ScopedTimer() { acc_ += now_s() - t0_; }

 private:
  double& acc_;
  double t0_;
};

// Converts rows of x [T, H] (f32/bf16/f16) to `dtype` into dst (T * H elements).
void convert_rows(const Tensor& x, DType dtype, void* dst);

// The rows tokens travel as, layer.act_row_bytes() each: x converted to the compute
// dtype, or under W8A8 one Q8 row per token (int8 payload + f32 scale tail, quantised
// exactly as the receiver's expand would). W8A8 with per-expert smooth vectors
// (!layer.smooth_uniform()) quantises per slot instead: see quantize_for_expert.
void token_rows(const MoeLayer& layer, const Tensor& x, void* dst);

// The receiving side of the all-to-all strategies: item i is one row of H values
// in the layer's compute dtype (W8A8: a Q8 row) at rows[i], for local expert local_expert[i]. Runs
// the experts on all items (grouped by expert with a stable sort, so rows keep
// their arrival order inside an expert) and writes item i's f32 output to
// out + i * H.
struct LocalItems {
  std::vector<const void*> rows;
  std::vector<int32_t> local_expert;
  void clear() {
    rows.clear();
    local_expert.clear();
  }
};
void run_local_items(MoeLayer& layer, const LocalItems& items, float* out);

// The source side: y[t] = sum over j = 0..k-1 of w[t, j] * slot(t, j), where
// slot(t, j) is the sum of the tp partial rows parts[(t*k + j)*tp + p], p in order
// (null parts are skipped). With tp = 1 this is exactly moe::combine's arithmetic,
// so results match the single-rank layer bit for bit.
void combine_slots(const float* weights, int64_t n_tokens, int64_t k, int tp, const std::vector<const float*>& parts,
                   int64_t hidden, float* y);

class SideThread;

// The shared experts of a call, overlapped with the routed experts' communication.
// start() launches shared(x) -> y [T, H] on a side thread (when overlapping) so the
// calling thread stays free to drive MPI: OpenMPI moves large messages only while
// an MPI call runs on the process (no progress thread on its shared-memory and TCP
// paths). finish() waits for it (or, without overlap, computes it now) and returns
// whether y holds an output to add. The side thread is shared by all layers and
// persistent, so its OpenMP team stays warm; one call at a time.
class SharedRun {
 public:
  // Starts shared(x) (on the side thread when opt.overlap), then waits for `req` (may
  // be null), counting that wait as communication. Under opt.shared_partial the shared
  // experts are not run here: the caller sums their slices over the attention-TP group.
  void start_then_wait(MoeLayer& layer, const Tensor& x, const EpOptions& opt, EpStats& stats, CommRequest* req);
  // Finishes the shared experts and adds their output to y [T, H] f32.
  void add_to(float* y);

 private:
  MoeLayer* layer_ = nullptr;
  Tensor x_;
  Tensor out_;  // [T, H] f32
  EpStats* stats_ = nullptr;
  bool async_ = false;
  bool run_ = false;  // the layer has shared experts and they run here
};

}  // namespace moe::dispatch
