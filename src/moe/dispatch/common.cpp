#include "moe/dispatch/common.h"

#include <cstring>

#include "core/check.h"

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

void run_local_items(MoeLayer& layer, const LocalItems& items, float* out) {
  const int64_t n = static_cast<int64_t>(items.rows.size());
  if (n == 0) return;
  const MoeLayerWeights& w = layer.weights();
  const int64_t n_local = w.n_local(), H = layer.config().hidden_size;
  const DType ct = layer.compute_dtype();
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(ct);
  std::vector<int64_t> offsets(n_local + 1, 0);
  for (int32_t le : items.local_expert) {
    MOE_DCHECK(le >= 0 && le < n_local);
    ++offsets[le + 1];
  }
  for (int64_t e = 0; e < n_local; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> pos(n), cursor(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) pos[i] = cursor[items.local_expert[i]]++;

  MoeScratch& s = layer.scratch();
  Tensor& a = MoeScratch::ensure(s.a, n, H, ct);
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

void shared_during(MoeLayer& layer, const Tensor& x, float* y_shared, CommRequest* req, bool overlap,
                   EpStats& stats) {
  if (!overlap && req) {
    ScopedTimer t(stats.comm_wait_s);
    req->wait();
  }
  if (layer.weights().shared) {
    ScopedTimer t(stats.shared_s);
    layer.shared_experts(x, y_shared, /*accumulate=*/false);
  }
  if (overlap && req) {
    ScopedTimer t(stats.comm_wait_s);
    req->wait();
  }
}

}  // namespace moe::dispatch
