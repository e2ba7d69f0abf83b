// A small dense tensor: dtype, shape, strides and shared storage.
//
// Storage is 128-byte aligned: two cache lines, so every row of a packed weight
// matrix or a scale vector read with 64-byte vector loads never straddles a line
// it does not own, and AVX-512 aligned loads are always legal on row starts.
// Tensors are cheap handles (shared_ptr to storage); views share the storage.
// Not thread-safe for concurrent reallocation; concurrent reads and writes to
// disjoint elements are fine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace moe {

using Shape = std::vector<int64_t>;

inline constexpr size_t kTensorAlign = 128;

std::string shape_str(const Shape& s);  // "[2, 3]"

// Owning aligned allocation. Frees with the matching aligned delete.
std::shared_ptr<void> aligned_alloc_shared(size_t bytes);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  // A view of memory owned by someone else; `keepalive` holds that owner (e.g. an mmap).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> keepalive);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // Typed access; checks that T has the dtype's size (catches f32/bf16 mix-ups).
  template <class T>
  T* data() {
    MOE_CHECK(sizeof(T) == dtype_size(dtype_), "tensor of dtype {} accessed as a {}-byte type",
              dtype_name(dtype_), sizeof(T));
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    return const_cast<Tensor*>(this)->data<T>();
  }

  // Rows [begin, end) of dim 0, as a view.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same storage, new shape (contiguous tensors only; numel must match).
  Tensor reshape(const Shape& shape) const;
  // A contiguous copy converted to `dtype` (float types only).
  Tensor to(DType dtype) const;
  Tensor clone() const { return to(dtype_); }

  std::string describe() const;  // "bf16[2, 3]"

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Shape shape_;
  Shape strides_;  // in elements
};

}  // namespace moe
