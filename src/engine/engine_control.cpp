// What an RL trainer drives between rollouts (engine_api.h): pause and
// resume, weight updates between steps, and releasing device memory to a
// colocated trainer. Every call takes the engine lock, so it waits for the
// step in flight and runs between two steps.
//
// Weight updates: the WeightStore (weight_store.h) keeps the base checkpoint,
// the overlay of tensors sent since and the staged buckets; a commit reloads
// the model from base + overlay, so a partial update keeps every other tensor.
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"

namespace megactx {

void Engine::pause(PauseMode mode) {
  {
    std::lock_guard inbox_lock(inbox_mutex_);
    paused_ = true;
  }
  std::lock_guard lock(engine_mutex_);
  process_commands();
  if (mode == PauseMode::Abort) {
    std::vector<RequestState*> all;
    for (auto& [rid, request] : requests_) all.push_back(request.get());
    for (RequestState* request : all) finish(*request, FinishReason::Abort, "generation paused");
  } else if (mode == PauseMode::Retract) {
    for (auto& [rid, request] : requests_) Speculator::drop_drafts(*request);
    scheduler_->retract_all();
  }
  update_stats();  // before the updates, as in a step
  deliver_updates();
}

void Engine::resume() {
  {
    std::lock_guard inbox_lock(inbox_mutex_);
    paused_ = false;
  }
  inbox_cv_.notify_all();
}

bool Engine::paused() const {
  std::lock_guard inbox_lock(inbox_mutex_);
  return paused_;
}

std::string Engine::weight_version() const {
  std::lock_guard lock(stats_mutex_);
  return weight_version_;
}

void Engine::set_weight_version(const std::string& version) {
  {
    std::lock_guard lock(stats_mutex_);
    weight_version_ = version;
  }
  spdlog::info("weight_version {} (weights unchanged)", version);
  update_stats();
}

Tensor Engine::weight_by_name(const std::string& name) {
  std::lock_guard lock(engine_mutex_);  // between steps and updates
  const std::shared_ptr<const Checkpoint> checkpoint = weights_.current();
  MEGACTX_CHECK(checkpoint->has(name), "the model has no tensor '{}'", name);
  return checkpoint->get_float(name, checkpoint->shape_of(name));
}

WeightUpdateResult Engine::update_weights(const WeightUpdateRequest& update) {
  std::lock_guard lock(engine_mutex_);
  MEGACTX_CHECK(!weights_released_,
                "the weights are released; /resume_memory_occupation with 'weights' first");
  WeightUpdateResult result;
  const auto reload = [this](const Checkpoint& checkpoint) { model_->reload_weights(checkpoint); };
  std::shared_ptr<const Checkpoint> checkpoint;
  if (!update.model_path.empty()) {
    MEGACTX_CHECK(update.bucket == nullptr, "a weight update gives a model_path or tensors");
    checkpoint = weights_.replace_base(update.model_path, reload);
    result.tensors = static_cast<int64_t>(checkpoint->names().size());
  } else {
    MEGACTX_CHECK(update.bucket != nullptr, "a weight update gives a model_path or tensors");
    // Checked before it is staged; a bad bucket fails the whole update.
    result.tensors = weights_.stage(*update.bucket);
    if (!update.commit) {
      result.weight_version = weight_version_;
      return result;
    }
    checkpoint = weights_.commit(reload);
  }
  // The MTP layer reads its weights from the same checkpoint (and on a
  // device lived beside the replaced ones).
  if (speculator_) speculator_->reload(*checkpoint);
  // KV held now is of the old weights: never shared again.
  for (auto& [rid, request] : requests_) request->shares_pages = false;
  if (update.flush_cache)
    for (const auto& prefix_cache : prefix_caches_) prefix_cache->retire();
  {
    std::lock_guard stats_lock(stats_mutex_);
    if (!update.weight_version.empty()) weight_version_ = update.weight_version;
    result.weight_version = weight_version_;
  }
  result.committed = true;
  spdlog::info("weights updated ({} tensors), weight_version {}", result.tensors,
               result.weight_version);
  update_stats();
  return result;
}

void Engine::release_memory(const MemoryTags& tags) {
  std::lock_guard lock(engine_mutex_);
  process_commands();
  if (tags.kv_cache && !kv_released_) {
    MEGACTX_CHECK(requests_.empty(),
                  "the KV cache cannot be released while {} requests are live (pause with "
                  "mode abort first)",
                  requests_.size());
    for (const auto& prefix_cache : prefix_caches_) prefix_cache->flush();
    // Assigned in place: the host tier and the scheduler keep their references.
    // The model's factory builds the empty pools on the cache's own device.
    KvCacheSpec none = capacity_.spec;
    none.num_pages = 0;
    none.offload_pages = 0;
    *cache_ = std::move(*model_->make_kv_cache(none));
    kv_released_ = true;
  }
  if (tags.weights && !weights_released_) {
    if (speculator_) speculator_->release();
    model_->release_weights();
    weights_released_ = true;
  }
  {
    std::lock_guard inbox_lock(inbox_mutex_);
    memory_released_ = weights_released_ || kv_released_;
  }
  update_stats();
}

void Engine::resume_memory(const MemoryTags& tags) {
  std::lock_guard lock(engine_mutex_);
  if (tags.weights && weights_released_) {
    // The weights as they were: base + overlay.
    const std::shared_ptr<const Checkpoint> checkpoint = weights_.current();
    model_->reload_weights(*checkpoint);
    if (speculator_) speculator_->reload(*checkpoint);
    weights_released_ = false;
  }
  if (tags.kv_cache && kv_released_) {
    *cache_ = std::move(*model_->make_kv_cache(capacity_.spec));
    kv_released_ = false;
  }
  {
    std::lock_guard inbox_lock(inbox_mutex_);
    memory_released_ = weights_released_ || kv_released_;
  }
  update_stats();
  inbox_cv_.notify_all();
}

}  // namespace megactx
