#include "moe/dispatch/common.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/threads.h"

namespace moe::dispatch {

void convert_rows(const Tensor& x, DType dtype, void* dst) {
  const size_t n = static_cast<size_t>(x.numel());
  if (n == 0) return;
  if (x.dtype() == dtype) {
    std::memcpy(dst, x.raw(), x.nbytes());
  } else if (x.dtype() == DType::F32) {
    convert_from_f32(x.data<float>(), dst, dtype, n);
  } else {
    MOE_CHECK(dtype == DType::F32, "cannot send {} rows as {}", dtype_name(x.dtype()), dtype_name(dtype));
    convert_to_f32(x.raw(), x.dtype(), static_cast<float*>(dst), n);
  }
}

void token_rows(const MoeLayer& layer, const Tensor& x, void* dst) {
  if (!layer.quantized()) return convert_rows(x, layer.compute_dtype(), dst);
  const int64_t T = x.dim(0), H = x.dim(1);
  const size_t in_row = static_cast<size_t>(H) * dtype_size(x.dtype()), out_row = layer.act_row_bytes();
  const auto* src = static_cast<const char*>(x.raw());
  auto* d = static_cast<char*>(dst);
  // Uniform smooth: any expert's quantisation is every expert's (expert 0's here).
#pragma omp parallel for schedule(static) if (T * H >= (1 << 15))
  for (int64_t t = 0; t < T; ++t) layer.quantize_for_expert(src + t * in_row, x.dtype(), 0, d + t * out_row);
}

void run_local_items(MoeLayer& layer, const LocalItems& items, float* out) {
  const int64_t n = static_cast<int64_t>(items.rows.size());
  if (n == 0) return;
  const MoeLayerWeights& w = layer.weights();
  const int64_t n_local = w.n_local(), H = layer.config().hidden_size;
  const DType ct = layer.compute_dtype();
  const size_t row_bytes = layer.act_row_bytes();
  std::vector<int64_t> offsets(n_local + 1, 0);
  for (int32_t le : items.local_expert) {
    MOE_DCHECK(le >= 0 && le < n_local);
    ++offsets[le + 1];
  }
  for (int64_t e = 0; e < n_local; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> pos(n), cursor(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) pos[i] = cursor[items.local_expert[i]]++;

  MoeScratch& s = layer.scratch();
  Tensor& a = layer.quantized() ? MoeScratch::ensure(s.a, n, static_cast<int64_t>(row_bytes), DType::I8)
                                : MoeScratch::ensure(s.a, n, H, ct);
  char* abase = static_cast<char*>(a.raw());
#pragma omp parallel for schedule(static) if (n * H >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) std::memcpy(abase + pos[i] * row_bytes, items.rows[i], row_bytes);
  Tensor& sorted = MoeScratch::ensure(s.out, n, H, DType::F32);
  ExpertsParams p;
  p.w13 = &w.w13;
  p.w2 = &w.w2;
  p.act = layer.config().act;
  p.a = a.raw();
  p.offsets = offsets.data();
  p.out = sorted.data<float>();
  run_experts(p, s);
  const float* src = sorted.data<float>();
#pragma omp parallel for schedule(static) if (n * H >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * H, src + pos[i] * H, H * sizeof(float));
}

void combine_slots(const float* weights, int64_t T, int64_t k, int tp, const std::vector<const float*>& parts,
                   int64_t H, float* y) {
#pragma omp parallel if (T * k * H >= (1 << 16))
  {
    std::vector<float> sum(tp > 1 ? H : 0);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* yt = y + t * H;
      std::memset(yt, 0, H * sizeof(float));
      for (int64_t j = 0; j < k; ++j) {
        const float w = weights[t * k + j];
        const float* const* p = &parts[(t * k + j) * tp];
        if (tp == 1) {
          if (!p[0]) continue;
          for (int64_t h = 0; h < H; ++h) yt[h] += w * p[0][h];
          continue;
        }
        std::fill(sum.begin(), sum.end(), 0.f);
        for (int q = 0; q < tp; ++q)
          if (p[q])
            for (int64_t h = 0; h < H; ++h) sum[h] += p[q][h];
        for (int64_t h = 0; h < H; ++h) yt[h] += w * sum[h];
      }
    }
  }
}

// One long-lived thread that runs the shared experts while the calling thread drives
// MPI. A persistent thread keeps its OpenMP team warm between layers (creating a
// team per call costs more than a decode step's communication).
class SideThread {
 public:
  SideThread() : thread_([this] { loop(); }) {}
  ~SideThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = std::move(fn);
      done_ = false;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  void join() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || fn_; });
      if (stop_) return;
      auto fn = std::move(fn_);
      fn_ = nullptr;
      lock.unlock();
      std::exception_ptr err;
      try {
        fn();
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      error_ = err;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> fn_;
  bool done_ = true, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

SideThread& side_thread() {
  static SideThread side;
  return side;
}

void SharedRun::start_then_wait(MoeLayer& layer, const Tensor& x, const EpOptions& opt, EpStats& stats,
                                CommRequest* req) {
  layer_ = &layer;
  x_ = x;
  stats_ = &stats;
  const int64_t T = x.dim(0), H = layer.config().hidden_size;
  const bool has = layer.weights().shared.has_value() && T > 0 && !opt.shared_partial;
  run_ = has;
  if (has) out_ = MoeScratch::ensure(out_, T, H, DType::F32);
  async_ = opt.overlap && has;
  if (async_) {
    const int nt = num_threads();
    side_thread().start([this, nt] {
      set_num_threads(nt);
      stats_->shared_begin_s = now_s();
      layer_->shared_experts(x_, out_.data<float>(), /*accumulate=*/false);
      stats_->shared_end_s = now_s();
      stats_->shared_s += stats_->shared_end_s - stats_->shared_begin_s;
    });
  }
  if (req) {
    ScopedTimer t(stats.comm_wait_s);
    req->wait();
  }
}

void SharedRun::add_to(float* y) {
  const int64_t T = x_.dim(0), H = layer_->config().hidden_size;
  if (!run_) return;
  if (async_) {
    ScopedTimer t(stats_->comm_wait_s);  // not communication, but time this thread is blocked
    side_thread().join();
  } else {
    stats_->shared_begin_s = now_s();
    layer_->shared_experts(x_, out_.data<float>(), /*accumulate=*/false);
    stats_->shared_end_s = now_s();
    stats_->shared_s += stats_->shared_end_s - stats_->shared_begin_s;
  }
  ScopedTimer t(stats_->compute_s);
  const float* s = out_.data<float>();
  for (int64_t i = 0; i < T * H; ++i) y[i] += s[i];
}

}  // namespace moe::dispatch
