#include "io/weight_update.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_blocks.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"

namespace megactx {

namespace {

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 ||
         dtype == DType::F8_E4M3;
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
      Fp8Blocks blocks = quantize_fp8_blocks(tensor.to_float());
      MEGACTX_CHECK(blocks.scales.shape() == base.shape_of(scale_name),
                    "weight update: '{}' scales {} differ from the model's {}", name,
                    shape_string(blocks.scales.shape()), shape_string(base.shape_of(scale_name)));
      out.put(name, std::move(blocks.codes));
      out.put(scale_name, std::move(blocks.scales));
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
