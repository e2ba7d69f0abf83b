#include "core/tensor.h"

#include <cstring>
#include <new>

namespace moe {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::shared_ptr<void> aligned_alloc_shared(size_t bytes) {
  const size_t n = (bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
  void* p = ::operator new(n == 0 ? kTensorAlign : n, std::align_val_t(kTensorAlign));
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t(kTensorAlign)); });
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
