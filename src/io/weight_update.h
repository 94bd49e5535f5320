// Weights that arrive while a model serves (RL weight sync). A trainer sends
// named tensors in buckets, each a safetensors file (bytes in a request body,
// or a file in /dev/shm); the buckets are staged, checked against the
// checkpoint the model was loaded from (every name known, every shape equal,
// a floating dtype), and then the model reloads from an OverlayCheckpoint:
// the base checkpoint with the staged tensors in front. Nothing the model
// holds changes until every check passed, so a bad bucket leaves the model
// exactly as it was.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint.h"

namespace megactx {

// Named tensors owned in memory, in their wire dtype (F32, BF16, F16, F8_E4M3;
// any other is kept too and refused by checked_overlay).
class TensorBucket {
 public:
  // A safetensors file's bytes; `label` names it in errors. The tensors are
  // copied out, so `bytes` may go away afterwards.
  static TensorBucket from_safetensors(std::string_view bytes, const std::string& label);
  static TensorBucket read_safetensors_file(const std::string& path);

  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  void put(const std::string& name, Tensor tensor);
  size_t size() const { return tensors_.size(); }
  int64_t bytes() const;

 private:
  std::map<std::string, Tensor> tensors_;
};

// A Checkpoint that answers from `overlay` first and from `base` for every
// other name (config, directory and names are the base's).
class OverlayCheckpoint final : public Checkpoint {
 public:
  OverlayCheckpoint(std::shared_ptr<const Checkpoint> base,
                    std::shared_ptr<const TensorBucket> overlay);

  const ModelConfig& config() const override { return base_->config(); }
  const std::string& directory() const override { return base_->directory(); }
  bool has(const std::string& name) const override;
  DType dtype_of(const std::string& name) const override;
  Shape shape_of(const std::string& name) const override;
  Tensor get(const std::string& name, const Shape& shape, DType dtype) const override;
  Tensor get_float(const std::string& name, const Shape& shape) const override;
  std::vector<std::string> names() const override { return base_->names(); }
  std::vector<std::string> unrequested() const override;
  // The tensors in front of the base (a parallel group sends only these).
  const TensorBucket& overlay() const { return *overlay_; }

 private:
  const Tensor* overlaid(const std::string& name) const;

  std::shared_ptr<const Checkpoint> base_;
  std::shared_ptr<const TensorBucket> overlay_;
  mutable std::mutex mutex_;                       // loaders may ask from several threads
  mutable std::map<std::string, bool> requested_;  // overlay names asked for
};

// Checks `staged` against `base` and returns what the overlay must hold:
// every name is a tensor of the base with the same shape and a floating
// dtype; where the base ships an fp8 matrix (e4m3 with `<name>_scale_inv`)
// and the bucket a wider one, the tensor is quantised to e4m3 with 128x128
// block scales (the checkpoint's own format) and both go into the result.
// Throws megactx::Error naming the first tensor that does not fit.
TensorBucket checked_overlay(const Checkpoint& base, const TensorBucket& staged);

// At a commit: every e4m3 matrix in `update` (everything staged since the
// last commit) comes with its `<name>_scale_inv`, so old scales never apply
// to new codes. The two may arrive in different buckets (a trainer splits
// its tensors into buckets by size, not by pairs). Throws naming the matrix.
void check_fp8_scales(const Checkpoint& base, const TensorBucket& update);

}  // namespace megactx
