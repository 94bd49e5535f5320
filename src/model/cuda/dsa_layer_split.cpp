// LayerSplit on GPUs (ModelPlan::kv_owner over the tensor-parallel group), as
// the host model's (dsa_model.cpp): each decoder layer's latent and indexer
// pools live on one rank, which alone writes the step's new rows into them
// and runs the layer's indexer; the others hold no pool of the layer. After
// the owner's writes (and top-k, broadcast with it on layers that run their
// indexer), the other ranks get what their attention reads, in one of two
// forms:
//
// - Decode-sized steps on the fast path (sends_selected_entries): only the
//   entries the step's rows selected, [rows x top_k, 656] bytes in fp8 (1.3 MB
//   a row for GLM-5.2, against 656 bytes per token of the whole context),
//   gathered by the owner into a dense slot and broadcast on a side stream
//   and communicator of their own, so that the broadcast runs while every
//   rank computes the layer's queries (q_b, W_UK); the attention waits for it
//   only when it reads the entries. Two dense slots, taken by successive
//   layers in turn, so a layer's gather never waits for the previous
//   layer's attention.
// - Other steps (prefill chunks, whose rows x top-k outgrow their context,
//   and the fallback attention): the owner's pool of the layer, the pages up
//   to the largest the step reads, into one scratch pool, synchronously.
//   P pages cost P x 64 x 656 bytes per layer (fp8). Sending a chunk's
//   context ahead during the previous layer (as the host model does) is the
//   next step.
//
// Eager steps (no graphs).
#if MEGACTX_HAVE_CUDA
#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/dsa_layout.h"
#include "kernels/cuda/kv_copy/gather_entries.h"
#include "model/cuda/cuda_dsa_model.h"
#include "parallel/nccl_communicator.h"

namespace megactx::cuda {

std::vector<KvCacheSpec> CudaDsaModel::kv_cache_shares(const KvCacheSpec& whole) const {
  // Each rank's scratch pool for the owners' pools (share_layer_kv) counts.
  return layer_split_shares(plan_, whole, /*borrowed_pool=*/true);
}

void CudaDsaModel::share_layer_kv(int64_t layer, bool indexer, Step& step, PagedKvCache& cache) {
  borrowed_layer_ = -1;
  split_entries_.layer = -1;
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
  if (sends_selected_entries(step, cache)) {
    share_selected_entries(layer, owner, step, cache);
    return;
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

bool CudaDsaModel::sends_selected_entries(const Step& step, const PagedKvCache& cache) {
  // MEGACTX_LAYER_SPLIT_ENTRIES=0: every step sends the pool (A/B runs; read once).
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_LAYER_SPLIT_ENTRIES");
    return !(value != nullptr && value[0] == '0');
  }();
  if (!enabled || !use_fast_attention(step) || row_block(step.tokens) < step.tokens) return false;
  // Every rank decides the same: the step and the plan are the same on each.
  const KvCacheSpec& spec = cache.spec();
  const int64_t pages =
      step.pages_in_use > 0 ? std::min(step.pages_in_use, spec.num_pages) : spec.num_pages;
  return step.tokens * selection_top_k(step) < pages * spec.page_size;
}

void CudaDsaModel::share_selected_entries(int64_t layer, int owner, const Step& step,
                                          PagedKvCache& cache) {
  SplitEntries& e = split_entries_;
  if (!e.made) {
    // Collective over the tensor group (ncclCommSplit): every rank reaches
    // its first such step at the same layer.
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&e.side, cudaStreamNonBlocking));
    for (int s = 0; s < 2; ++s) {
      MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&e.gathered[s], cudaEventDisableTiming));
      MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&e.received[s], cudaEventDisableTiming));
    }
    e.group = parallel::split_nccl_on_stream(*tensor_group_, 0, plan_.tensor_parallel_rank, e.side);
    e.made = true;
  }
  const bool mine = owner == plan_.tensor_parallel_rank;
  const LayerSlots selected = layer_slots(step);  // the same slots on every rank
  const int64_t entries = step.tokens * selected.top_k;
  const int slot = e.next;
  e.next ^= 1;
  // The slot's last broadcast (two layers ago) is over before it is refilled.
  MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.received[slot], 0));
  uint8_t* rows = e.rows[slot].get<uint8_t>(entries * kLatentBytes);
  GatherEntriesParams gather;
  gather.slots = selected.slots;
  gather.entries = entries;
  gather.dense_slots = e.slots.get<int32_t>(entries);
  gather.entry_bytes = kLatentBytes;
  if (mine) {
    gather.pool = static_cast<const uint8_t*>(cache.latent_pool(layer).raw());
    gather.dense = rows;
  }
  timer_.mark("layer split entries", stream_);
  gather_entries(gather, stream_);
  const int64_t bytes = entries * kLatentBytes;
  if (e.group != nullptr) {
    MEGACTX_CUDA_CHECK(cudaEventRecord(e.gathered[slot], stream_));
    MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(e.side, e.gathered[slot], 0));
    e.group->broadcast(rows, bytes, owner);
    MEGACTX_CUDA_CHECK(cudaEventRecord(e.received[slot], e.side));
  } else {
    tensor_group_->broadcast(rows, bytes, owner);
    MEGACTX_CUDA_CHECK(cudaEventRecord(e.received[slot], stream_));
  }
  if (!mine) {
    e.layer = layer;
    e.slot = slot;
  }
}

std::optional<CudaDsaModel::BorrowedEntries> CudaDsaModel::borrowed_entries(int64_t layer) {
  SplitEntries& e = split_entries_;
  if (e.layer != layer) return std::nullopt;
  MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.received[e.slot], 0));
  return BorrowedEntries{e.rows[e.slot].as<uint8_t>(), e.slots.as<int32_t>()};
}

const void* CudaDsaModel::latent_pool_of(const PagedKvCache& cache, int64_t layer) const {
  if (layer == borrowed_layer_) return scratch_.borrowed_latent.as<uint8_t>();
  return cache.latent_pool(layer).raw();
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
