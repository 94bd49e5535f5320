// Tensor: a dense row-major array with a dtype, a shape and a device.
//
// A Tensor either owns its storage (shared, reference counted, so copies are
// cheap views of the same bytes) or views memory owned elsewhere (an mmapped
// safetensors file, a KV pool page). Strides are always contiguous row-major:
// kernels that need other layouts say so in their own parameter structs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace megactx {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Owning host tensor, zero-filled.
  static Tensor zeros(Shape shape, DType dtype = DType::F32);
  // Owning host tensor, contents unspecified (use when every element is written).
  static Tensor empty(Shape shape, DType dtype = DType::F32);
  // Non-owning view of memory that outlives the tensor.
  static Tensor view(const void* data, Shape shape, DType dtype, Device device = Device::CPU);
  // Takes ownership of `data`; `release` frees it (e.g. cudaFree for device memory).
  static Tensor adopt(void* data, Shape shape, DType dtype, Device device,
                      std::function<void(void*)> release);

  bool defined() const { return data_ != nullptr || shape_numel(shape_) == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Same bytes, another shape with the same element count.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) along axis 0, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A deep copy on the host (same dtype).
  Tensor clone() const;
  // A host float32 copy, converting bf16/f16/fp8 elements.
  Tensor to_float() const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  Shape shape_;
};

// Converts `count` elements of `dtype` at `source` to float.
void convert_to_float(const void* source, DType dtype, size_t count, float* destination);

}  // namespace megactx
