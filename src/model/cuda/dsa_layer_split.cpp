// LayerSplit on GPUs (ModelPlan::kv_owner over the tensor-parallel group), as
// the host model's (dsa_model.cpp): each decoder layer's latent and indexer
// pools live on one rank, which alone writes the step's new rows into them
// and runs the layer's indexer; the others hold no pool of the layer.
//
// This first GPU form favours the simplest correct exchange: after the
// owner's writes (and top-k), its latent pool of the layer (the pages up to
// the largest the step reads) is broadcast into one scratch pool on the
// other ranks, and the selection (positions [rows, top-k] and counts) with
// it on layers that run their indexer; every rank's attention core then
// reads its heads' entries as usual. P pages cost P x 64 x 656 bytes per
// layer and step (fp8):
// the form Z.ai describes sends only what is needed ahead of use (the step's
// selected entries for decode, the context's pages for prefill) into two
// scratch slots on a side stream, overlapped with the indexer or the MoE:
// that is the next step, once this one has run. Eager steps (no graphs).
#if MEGACTX_HAVE_CUDA
#include <algorithm>

#include "core/error.h"
#include "model/cuda/cuda_dsa_model.h"

namespace megactx::cuda {

std::vector<KvCacheSpec> CudaDsaModel::kv_cache_shares(const KvCacheSpec& whole) const {
  return layer_split_shares(plan_, whole);
}

void CudaDsaModel::share_layer_kv(int64_t layer, bool indexer, Step& step, PagedKvCache& cache) {
  borrowed_layer_ = -1;
  if (!plan_.layer_split || layer >= config_.num_hidden_layers) return;
  const int owner = plan_.kv_owner_of(layer);
  const bool mine = owner == plan_.tensor_parallel_rank;
  if (indexer) {
    // The owner's top-k of the step's rows; the shared layers after it reuse it.
    const auto word = static_cast<int64_t>(sizeof(int32_t));
    tensor_group_->broadcast(step.topk, step.tokens * index_topk_ * word, owner);
    tensor_group_->broadcast(step.counts, step.tokens * word, owner);
    if (!mine) ++selection_epoch_;  // step.topk changed under the cached slot tables
  }
  // The layer's latent pool, in the cache's layout (every layer's is the
  // same size; entries token-major, page p's at p x page_size): the pages up
  // to the largest one the step reads.
  const KvCacheSpec& spec = cache.spec();
  const int64_t entry = spec.page_size * spec.latent_bytes_per_token();
  const int64_t pages =
      step.pages_in_use > 0 ? std::min(step.pages_in_use, spec.num_pages) : spec.num_pages;
  void* pool = mine ? cache.latent_pool(layer).raw()
                    : scratch_.borrowed_latent.get<uint8_t>(spec.num_pages * entry);
  tensor_group_->broadcast(pool, pages * entry, owner);
  if (!mine) borrowed_layer_ = layer;
}

const void* CudaDsaModel::latent_pool_of(const PagedKvCache& cache, int64_t layer) const {
  if (layer == borrowed_layer_) return scratch_.borrowed_latent.as<uint8_t>();
  return cache.latent_pool(layer).raw();
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
