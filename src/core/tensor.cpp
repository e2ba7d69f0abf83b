#include "core/tensor.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

namespace moe {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {

constexpr size_t kPoolMin = size_t{1} << 20;  // smaller blocks: malloc's own free lists reuse them

// n rounded up to a multiple of an eighth of its power of two (at most 12.5% more).
size_t size_class(size_t n) {
  const size_t step = std::bit_floor(n) / 8;
  return (n + step - 1) / step * step;
}

size_t pool_cap() {
  if (const char* e = std::getenv("MOE_TENSOR_POOL_MB")) return static_cast<size_t>(std::strtoull(e, nullptr, 10)) << 20;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const size_t ram = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  return std::min<size_t>(size_t{2} << 30, ram / 8);
}

struct Pool {
  std::mutex mu;
  std::unordered_multimap<size_t, void*> free;  // size class -> block
  size_t bytes = 0;
  const size_t cap = pool_cap();
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: blocks may be freed during static destruction
  return *p;
}

void release(void* q) { ::operator delete(q, std::align_val_t(kTensorAlign)); }

}  // namespace

std::shared_ptr<void> aligned_alloc_shared(size_t bytes) {
  const size_t n = (bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
  if (n < kPoolMin || pool().cap == 0) {
    void* p = ::operator new(n == 0 ? kTensorAlign : n, std::align_val_t(kTensorAlign));
    return std::shared_ptr<void>(p, release);
  }
  const size_t c = size_class(n);
  void* p = nullptr;
  {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.mu);
    if (auto it = pl.free.find(c); it != pl.free.end()) {
      p = it->second;
      pl.free.erase(it);
      pl.bytes -= c;
    }
  }
  if (!p) p = ::operator new(c, std::align_val_t(kTensorAlign));
  return std::shared_ptr<void>(p, [c](void* q) {
    Pool& pl = pool();
    {
      std::lock_guard<std::mutex> lock(pl.mu);
      if (pl.bytes + c <= pl.cap) {
        pl.free.emplace(c, q);
        pl.bytes += c;
        return;
      }
    }
    release(q);
  });
}

void tensor_pool_trim() {
  std::unordered_multimap<size_t, void*> blocks;
  {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.mu);
    blocks.swap(pl.free);
    pl.bytes = 0;
  }
  for (const auto& [c, q] : blocks) release(q);
}

size_t tensor_pool_bytes() {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lock(pl.mu);
  return pl.bytes;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

static void check_shape(const Shape& shape) {
  for (int64_t d : shape) MOE_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  check_shape(shape);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ = aligned_alloc_shared(t.nbytes());
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> keepalive) {
  check_shape(shape);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ = std::move(keepalive);
  t.data_ = data;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

// Compared in place: kernels check this on every call, so it must not allocate.
bool Tensor::is_contiguous() const {
  if (strides_.size() != shape_.size()) return false;
  int64_t s = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MOE_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
            "row slice [{}, {}) out of range for tensor {}", begin, end, describe());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + begin * strides_[0] * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  MOE_CHECK(is_contiguous(), "reshape of a non-contiguous tensor {}", describe());
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  MOE_CHECK(t.numel() == numel(), "cannot reshape {} to {}", describe(), shape_str(shape));
  return t;
}

Tensor Tensor::to(DType dtype) const {
  MOE_CHECK(is_contiguous(), "conversion of a non-contiguous tensor {}", describe());
  Tensor out = empty(shape_, dtype);
  const size_t n = static_cast<size_t>(numel());
  if (dtype == dtype_) {
    std::memcpy(out.data_, data_, nbytes());
  } else if (dtype_ == DType::F32) {
    convert_from_f32(static_cast<const float*>(data_), out.data_, dtype, n);
  } else if (dtype == DType::F32) {
    convert_to_f32(data_, dtype_, static_cast<float*>(out.data_), n);
  } else {
    Tensor tmp = to(DType::F32);
    return tmp.to(dtype);
  }
  return out;
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

}  // namespace moe
