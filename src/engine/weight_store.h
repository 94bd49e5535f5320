// WeightStore: the weights an Engine serves, as checkpoints, for weight
// updates without a restart (engine_control.cpp). The base is the checkpoint
// the model was loaded from (EngineConfig::model_dir, opened on first use) or
// the last update_weights_from_disk folder; tensors sent in buckets since then
// form an overlay in front of it (io/weight_update.h), so a partial update
// keeps every other tensor as it was. Buckets are staged until a commit. The
// overlay is held in host memory: at most one copy of the model's tensors
// (names repeat).
//
// Every change is all or nothing: `apply` (the model's reload from the new
// checkpoint) runs first, and the store changes only when it returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "io/weight_update.h"

namespace megactx {

class WeightStore {
 public:
  using Apply = std::function<void(const Checkpoint&)>;

  explicit WeightStore(std::string model_dir) : model_dir_(std::move(model_dir)) {}

  // update_weights_from_disk: the folder at `path` becomes the base once
  // `apply` succeeded; the overlay and the staged buckets go with the old base.
  std::shared_ptr<const Checkpoint> replace_base(const std::string& path, const Apply& apply);
  // Checks a bucket against the base and stages it; returns how many tensors
  // are staged. A bad bucket drops everything staged before it too (a later
  // commit cannot apply part of a set) and throws.
  int64_t stage(const TensorBucket& bucket);
  // base + overlay + staged through `apply`; the staged buckets are cleared
  // either way, the overlay grows only when `apply` succeeded.
  std::shared_ptr<const Checkpoint> commit(const Apply& apply);
  // The weights as they are now (resuming released weights).
  std::shared_ptr<const Checkpoint> current();

 private:
  const std::shared_ptr<const Checkpoint>& base();

  std::string model_dir_;
  std::shared_ptr<const Checkpoint> base_;
  std::shared_ptr<TensorBucket> overlay_;  // tensors sent since the base was loaded
  TensorBucket staged_;                    // buckets not yet committed
};

}  // namespace megactx
