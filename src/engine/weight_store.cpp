#include "engine/weight_store.h"

#include "core/error.h"

namespace megactx {

const std::shared_ptr<const Checkpoint>& WeightStore::base() {
  if (!base_) {
    MEGACTX_CHECK(!model_dir_.empty(),
                  "weight updates need the checkpoint the model came from "
                  "(EngineConfig::model_dir)");
    base_ = Checkpoint::open(model_dir_);
  }
  return base_;
}

std::shared_ptr<const Checkpoint> WeightStore::replace_base(const std::string& path,
                                                            const Apply& apply) {
  std::shared_ptr<const Checkpoint> loaded = Checkpoint::open(path);
  apply(*loaded);
  base_ = loaded;
  overlay_ = std::make_shared<TensorBucket>();
  staged_ = TensorBucket{};
  return loaded;
}

int64_t WeightStore::stage(const TensorBucket& bucket) {
  TensorBucket checked;
  try {
    checked = checked_overlay(*base(), bucket);
  } catch (...) {
    staged_ = TensorBucket{};
    throw;
  }
  for (const auto& [name, tensor] : checked.tensors()) staged_.put(name, tensor);
  return static_cast<int64_t>(staged_.size());
}

std::shared_ptr<const Checkpoint> WeightStore::commit(const Apply& apply) {
  try {
    check_fp8_scales(*base(), staged_);
  } catch (...) {
    staged_ = TensorBucket{};
    throw;
  }
  auto overlay =
      overlay_ ? std::make_shared<TensorBucket>(*overlay_) : std::make_shared<TensorBucket>();
  for (const auto& [name, tensor] : staged_.tensors()) overlay->put(name, tensor);
  staged_ = TensorBucket{};  // applied or, on an error, dropped
  auto merged = std::make_shared<OverlayCheckpoint>(base(), overlay);
  apply(*merged);
  overlay_ = overlay;
  return merged;
}

std::shared_ptr<const Checkpoint> WeightStore::current() {
  const std::shared_ptr<const Checkpoint>& from = base();
  if (!overlay_) return from;
  return std::make_shared<OverlayCheckpoint>(from, overlay_);
}

}  // namespace megactx
