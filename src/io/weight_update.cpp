#include "io/weight_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"

namespace megactx {

namespace {

constexpr int64_t kFp8Block = 128;  // HF fp8 checkpoints: one scale per 128 x 128 block
constexpr float kFp8Max = 448.0f;

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 ||
         dtype == DType::F8_E4M3;
}

float element(const Tensor& tensor, int64_t i) {
  switch (tensor.dtype()) {
    case DType::F32:
      return tensor.data<float>()[i];
    case DType::BF16:
      return bf16_to_float(tensor.data<uint16_t>()[i]);
    case DType::F16:
      return f16_to_float(tensor.data<uint16_t>()[i]);
    case DType::F8_E4M3:
      return fp8_e4m3_to_float(tensor.data<uint8_t>()[i]);
    default:
      fail("tensor of dtype {} is not floating", dtype_name(tensor.dtype()));
  }
}

// [rows, cols] floating -> e4m3 [rows, cols] and float32 scales
// [ceil(rows / 128), ceil(cols / 128)] with value = e4m3 * scale.
std::pair<Tensor, Tensor> quantize_fp8_blocks(const Tensor& source) {
  const int64_t rows = source.dim(0), cols = source.dim(1);
  const int64_t block_rows = (rows + kFp8Block - 1) / kFp8Block;
  const int64_t block_cols = (cols + kFp8Block - 1) / kFp8Block;
  Tensor values = Tensor::empty({rows, cols}, DType::F8_E4M3);
  Tensor scales = Tensor::empty({block_rows, block_cols}, DType::F32);
  for (int64_t br = 0; br < block_rows; ++br) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const int64_t r0 = br * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
      const int64_t c0 = bc * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(element(source, r * cols + c)));
      const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
      scales.data<float>()[br * block_cols + bc] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          values.data<uint8_t>()[r * cols + c] =
              float_to_fp8_e4m3(element(source, r * cols + c) / scale);
    }
  }
  return {values, scales};
}

}  // namespace

TensorBucket TensorBucket::from_safetensors(std::string_view bytes, const std::string& label) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const SafetensorsHeader header = parse_safetensors_header(data, bytes.size(), label);
  TensorBucket bucket;
  // Every dtype is kept: checked_overlay rejects what is not floating inside
  // the engine, where a bad bucket also drops what was staged before it
  // (as a wrong name or shape does).
  for (const SafetensorsEntry& entry : header.entries) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
    if (tensor.nbytes() > 0)
      std::memcpy(tensor.raw(), data + header.data_offset + entry.begin, tensor.nbytes());
    bucket.put(entry.name, std::move(tensor));
  }
  return bucket;
}

TensorBucket TensorBucket::read_safetensors_file(const std::string& path) {
  const MappedFile file(path);
  return from_safetensors(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()),
                          path);
}

void TensorBucket::put(const std::string& name, Tensor tensor) {
  tensors_[name] = std::move(tensor);
}

int64_t TensorBucket::bytes() const {
  int64_t total = 0;
  for (const auto& [name, tensor] : tensors_) total += static_cast<int64_t>(tensor.nbytes());
  return total;
}

OverlayCheckpoint::OverlayCheckpoint(std::shared_ptr<const Checkpoint> base,
                                     std::shared_ptr<const TensorBucket> overlay)
    : base_(std::move(base)), overlay_(std::move(overlay)) {
  MEGACTX_CHECK(base_ != nullptr && overlay_ != nullptr, "overlay checkpoint without a base");
}

const Tensor* OverlayCheckpoint::overlaid(const std::string& name) const {
  auto it = overlay_->tensors().find(name);
  return it == overlay_->tensors().end() ? nullptr : &it->second;
}

bool OverlayCheckpoint::has(const std::string& name) const {
  return overlaid(name) != nullptr || base_->has(name);
}

DType OverlayCheckpoint::dtype_of(const std::string& name) const {
  const Tensor* tensor = overlaid(name);
  return tensor ? tensor->dtype() : base_->dtype_of(name);
}

Shape OverlayCheckpoint::shape_of(const std::string& name) const {
  const Tensor* tensor = overlaid(name);
  return tensor ? tensor->shape() : base_->shape_of(name);
}

Tensor OverlayCheckpoint::get(const std::string& name, const Shape& shape, DType dtype) const {
  const Tensor* tensor = overlaid(name);
  if (!tensor) return base_->get(name, shape, dtype);
  MEGACTX_CHECK(tensor->dtype() == dtype, "tensor '{}' has dtype {} but {} was expected", name,
                dtype_name(tensor->dtype()), dtype_name(dtype));
  MEGACTX_CHECK(tensor->shape() == shape, "tensor '{}' has shape {} but {} was expected", name,
                shape_string(tensor->shape()), shape_string(shape));
  {
    std::lock_guard lock(mutex_);
    requested_[name] = true;
  }
  return *tensor;
}

Tensor OverlayCheckpoint::get_float(const std::string& name, const Shape& shape) const {
  const Tensor* tensor = overlaid(name);
  if (!tensor) return base_->get_float(name, shape);
  MEGACTX_CHECK(is_floating(tensor->dtype()), "tensor '{}' has dtype {}, not a floating dtype",
                name, dtype_name(tensor->dtype()));
  MEGACTX_CHECK(tensor->shape() == shape, "tensor '{}' has shape {} but {} was expected", name,
                shape_string(tensor->shape()), shape_string(shape));
  {
    std::lock_guard lock(mutex_);
    requested_[name] = true;
  }
  return *tensor;
}

std::vector<std::string> OverlayCheckpoint::unrequested() const {
  std::vector<std::string> result;
  std::lock_guard lock(mutex_);
  for (const std::string& name : base_->unrequested())
    if (!requested_.count(name)) result.push_back(name);
  return result;
}

TensorBucket checked_overlay(const Checkpoint& base, const TensorBucket& staged) {
  TensorBucket out;
  for (const auto& [name, tensor] : staged.tensors()) {
    MEGACTX_CHECK(base.has(name), "weight update: the model has no tensor '{}'", name);
    MEGACTX_CHECK(is_floating(tensor.dtype()),
                  "weight update: tensor '{}' has dtype {}, not a floating dtype", name,
                  dtype_name(tensor.dtype()));
    const Shape expected = base.shape_of(name);
    MEGACTX_CHECK(tensor.shape() == expected,
                  "weight update: tensor '{}' has shape {}, the model's is {}", name,
                  shape_string(tensor.shape()), shape_string(expected));
    const std::string scale_name = name + "_scale_inv";
    const bool fp8_target = base.dtype_of(name) == DType::F8_E4M3 && base.has(scale_name);
    if (fp8_target && tensor.dtype() != DType::F8_E4M3) {
      MEGACTX_CHECK(tensor.rank() == 2, "weight update: fp8 tensor '{}' must be a matrix", name);
      auto [values, scales] = quantize_fp8_blocks(tensor);
      MEGACTX_CHECK(scales.shape() == base.shape_of(scale_name),
                    "weight update: '{}' scales {} differ from the model's {}", name,
                    shape_string(scales.shape()), shape_string(base.shape_of(scale_name)));
      out.put(name, std::move(values));
      out.put(scale_name, std::move(scales));
    } else {
      out.put(name, tensor);
    }
  }
  return out;
}

void check_fp8_scales(const Checkpoint& base, const TensorBucket& update) {
  for (const auto& [name, tensor] : update.tensors()) {
    if (tensor.dtype() != DType::F8_E4M3 || base.dtype_of(name) != DType::F8_E4M3) continue;
    const std::string scale_name = name + "_scale_inv";
    MEGACTX_CHECK(!base.has(scale_name) || update.tensors().count(scale_name),
                  "weight update: e4m3 tensor '{}' needs its '{}' in the same update", name,
                  scale_name);
  }
}

}  // namespace megactx
