// Checkpoint: a Hugging Face model directory. Opens config.json and the
// weights (model.safetensors, or the shards named by
// model.safetensors.index.json), memory-mapped and zero copy. The model asks
// for every tensor by name, shape and dtype; a mismatch or a missing tensor is
// an Error naming the tensor; names never asked for can be listed afterwards.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"

namespace megactx {

class Checkpoint {
 public:
  // Throws megactx::Error for a missing/unreadable/truncated/inconsistent file.
  static std::unique_ptr<Checkpoint> open(const std::string& model_dir);
  virtual ~Checkpoint() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const std::string& directory() const = 0;
  virtual bool has(const std::string& name) const = 0;
  virtual DType dtype_of(const std::string& name) const = 0;
  virtual Shape shape_of(const std::string& name) const = 0;
  // A zero-copy host view of the tensor (valid while the Checkpoint lives),
  // after checking its shape and dtype.
  virtual Tensor get(const std::string& name, const Shape& shape, DType dtype) const = 0;
  // Same, accepting any floating dtype (F32, BF16, F16, F8_E4M3).
  virtual Tensor get_float(const std::string& name, const Shape& shape) const = 0;
  virtual std::vector<std::string> names() const = 0;
  // Names of tensors never returned by get/get_float (to report unexpected tensors).
  virtual std::vector<std::string> unrequested() const = 0;
};

}  // namespace megactx
