#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace megactx {

std::string shape_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t shape_numel(const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

namespace {
std::shared_ptr<void> allocate_host(size_t bytes) {
  // 64-byte alignment suits AVX-512 loads and cache lines.
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  MEGACTX_CHECK(memory != nullptr, "out of host memory allocating {} bytes", bytes);
  return std::shared_ptr<void>(memory, [](void* pointer) { std::free(pointer); });
}
}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t extent : shape) MEGACTX_CHECK(extent >= 0, "negative extent in shape {}", shape_string(shape));
  Tensor tensor;
  tensor.shape_ = std::move(shape);
  tensor.dtype_ = dtype;
  tensor.storage_ = allocate_host(tensor.nbytes());
  tensor.data_ = tensor.storage_.get();
  return tensor;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor tensor = empty(std::move(shape), dtype);
  std::memset(tensor.data_, 0, tensor.nbytes());
  return tensor;
}

Tensor Tensor::view(const void* data, Shape shape, DType dtype, Device device) {
  Tensor tensor;
  tensor.shape_ = std::move(shape);
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.data_ = const_cast<void*>(data);
  return tensor;
}

Tensor Tensor::adopt(void* data, Shape shape, DType dtype, Device device,
                     std::function<void(void*)> release) {
  Tensor tensor = view(data, std::move(shape), dtype, device);
  tensor.storage_ = std::shared_ptr<void>(data, std::move(release));
  return tensor;
}

int64_t Tensor::dim(int axis) const {
  const int resolved = axis < 0 ? axis + rank() : axis;
  MEGACTX_CHECK(resolved >= 0 && resolved < rank(), "axis {} out of range for shape {}", axis,
                shape_string(shape_));
  return shape_[resolved];
}

Tensor Tensor::reshape(Shape shape) const {
  MEGACTX_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_string(shape_),
                shape_string(shape));
  Tensor result = *this;
  result.shape_ = std::move(shape);
  return result;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MEGACTX_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
                "row slice [{}, {}) out of range for shape {}", begin, end, shape_string(shape_));
  Tensor result = *this;
  const int64_t row_elements = shape_[0] == 0 ? 0 : numel() / shape_[0];
  result.data_ = static_cast<std::byte*>(data_) + begin * row_elements * dtype_size(dtype_);
  result.shape_[0] = end - begin;
  return result;
}

Tensor Tensor::clone() const {
  MEGACTX_CHECK(device_ == Device::CPU, "clone() is host-only");
  Tensor copy = empty(shape_, dtype_);
  if (nbytes()) std::memcpy(copy.data_, data_, nbytes());
  return copy;
}

Tensor Tensor::to_float() const {
  MEGACTX_CHECK(device_ == Device::CPU, "to_float() is host-only");
  Tensor result = empty(shape_, DType::F32);
  convert_to_float(data_, dtype_, static_cast<size_t>(numel()), result.data<float>());
  return result;
}

void convert_to_float(const void* source, DType dtype, size_t count, float* destination) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(destination, source, count * 4);
      return;
    case DType::BF16: {
      const auto* bits = static_cast<const uint16_t*>(source);
      for (size_t i = 0; i < count; ++i) destination[i] = bf16_to_float(bits[i]);
      return;
    }
    case DType::F16: {
      const auto* bits = static_cast<const uint16_t*>(source);
      for (size_t i = 0; i < count; ++i) destination[i] = f16_to_float(bits[i]);
      return;
    }
    case DType::F8_E4M3: {
      const auto* bits = static_cast<const uint8_t*>(source);
      for (size_t i = 0; i < count; ++i) destination[i] = fp8_e4m3_to_float(bits[i]);
      return;
    }
    default:
      fail("cannot convert {} to float", dtype_name(dtype));
  }
}

}  // namespace megactx
