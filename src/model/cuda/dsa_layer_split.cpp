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
//   to the largest the step reads (P pages: P x 64 x 656 bytes in fp8), into
//   one of two borrowed pools, layer l's in pool l % 2. It goes ahead of use:
//   while layer l runs, the side stream carries layer l + 1's pool (nothing
//   writes it until layer l + 1), and at layer l + 1 only the chunk's new
//   rows follow (the owner writes them, gathers them dense and sends them;
//   the others scatter them into the borrowed pool). The first layer of a
//   step, or every layer with MEGACTX_LAYER_SPLIT_PREFETCH=0, sends its pool
//   at its own turn.
//
// Decode steps run as CUDA Graphs when they send the selected entries (the
// key's rows and context fix the form and every size; a step whose entries
// outgrow its pool sends the pool, eagerly): every exchange of a step on the
// side stream is joined back at its end (join_layer_split_side), and waits
// only on events recorded in the same step.
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
  // Each rank's two borrowed pools for the owners' pools (share_layer_pool) count.
  return layer_split_shares(plan_, whole, /*borrowed_pools=*/2);
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
  // same size; entries token-major, page p's at p x page_size).
  share_layer_pool(layer, owner, step, cache);
}

CudaDsaModel::SplitEntries& CudaDsaModel::split_entries() {
  SplitEntries& e = split_entries_;
  if (!e.made) {
    // Collective over the tensor group (ncclCommSplit): every rank reaches
    // its first LayerSplit exchange at the same layer.
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&e.side, cudaStreamNonBlocking));
    for (int s = 0; s < 2; ++s) {
      for (cudaEvent_t* event : {&e.gathered[s], &e.received[s], &e.prefetched[s]})
        MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
    }
    e.group = parallel::split_nccl_on_stream(*tensor_group_, 0, plan_.tensor_parallel_rank, e.side);
    e.made = true;
  }
  return e;
}

void CudaDsaModel::begin_layer_split_step(const std::vector<int32_t>& new_slots) {
  SplitEntries& e = split_entries_;
  e.prefetched_layer[0] = e.prefetched_layer[1] = -1;
  e.new_rows = static_cast<int64_t>(new_slots.size());
  if (!new_slots.empty()) upload(e.new_slots, new_slots, stream_);
}

void CudaDsaModel::share_layer_pool(int64_t layer, int owner, const Step& step,
                                    PagedKvCache& cache) {
  SplitEntries& e = split_entries();
  const KvCacheSpec& spec = cache.spec();
  const int64_t entry = spec.latent_bytes_per_token();
  const int64_t page_bytes = spec.page_size * entry;
  const int64_t pages =
      step.pages_in_use > 0 ? std::min(step.pages_in_use, spec.num_pages) : spec.num_pages;
  const bool mine = owner == plan_.tensor_parallel_rank;
  const int slot = static_cast<int>(layer % 2);
  uint8_t* borrowed = mine ? nullptr : e.pools[slot].get<uint8_t>(spec.num_pages * page_bytes);
  timer_.mark("layer split pool", stream_);
  if (e.prefetched_layer[slot] == layer) {
    // The old context came during the previous layer: now the chunk's new
    // rows, which the owner wrote just now ([new rows, entry] dense).
    uint8_t* dense = e.new_dense.get<uint8_t>(e.new_rows * entry);
    if (mine) {
      GatherEntriesParams gather;
      gather.slots = e.new_slots.as<int32_t>();
      gather.entries = e.new_rows;
      gather.dense_slots = e.new_dense_slots.get<int32_t>(e.new_rows);
      gather.pool = static_cast<const uint8_t*>(cache.latent_pool(layer).raw());
      gather.dense = dense;
      gather.entry_bytes = static_cast<int>(entry);
      gather_entries(gather, stream_);
    }
    tensor_group_->broadcast(dense, e.new_rows * entry, owner);
    if (!mine) {
      MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.prefetched[slot], 0));
      ScatterEntriesParams scatter;
      scatter.dense = dense;
      scatter.slots = e.new_slots.as<int32_t>();
      scatter.entries = e.new_rows;
      scatter.pool = borrowed;
      scatter.entry_bytes = static_cast<int>(entry);
      scatter_entries(scatter, stream_);
    }
  } else {
    void* pool = mine ? cache.latent_pool(layer).raw() : borrowed;
    tensor_group_->broadcast(pool, pages * page_bytes, owner);
  }
  if (!mine) {
    borrowed_layer_ = layer;
    e.borrowed_pool = slot;
  }
  // The next layer's pool, ahead of its use: nothing writes it until then.
  const int64_t next = layer + 1;
  const int next_owner = next < config_.num_hidden_layers ? plan_.kv_owner_of(next) : -1;
  if (!layer_split_prefetch() || next_owner < 0 || e.new_rows == 0) return;
  const int next_slot = static_cast<int>(next % 2);
  const bool next_mine = next_owner == plan_.tensor_parallel_rank;
  void* pool = next_mine ? cache.latent_pool(next).raw()
                         : e.pools[next_slot].get<uint8_t>(spec.num_pages * page_bytes);
  if (e.group != nullptr) {
    // The side stream starts after everything queued so far, the attention
    // of layer next - 2 (the last reader of this borrowed pool) included.
    MEGACTX_CUDA_CHECK(cudaEventRecord(e.gathered[next_slot], stream_));
    MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(e.side, e.gathered[next_slot], 0));
    e.group->broadcast(pool, pages * page_bytes, next_owner);
    MEGACTX_CUDA_CHECK(cudaEventRecord(e.prefetched[next_slot], e.side));
  } else {
    tensor_group_->broadcast(pool, pages * page_bytes, next_owner);
    MEGACTX_CUDA_CHECK(cudaEventRecord(e.prefetched[next_slot], stream_));
  }
  e.prefetched_layer[next_slot] = next;
}

void CudaDsaModel::before_layer_split_write(int64_t layer) {
  // The owner's pool of `layer` may still be on its way to the others (the
  // prefetch during the previous layer): its new rows wait for that.
  const SplitEntries& e = split_entries_;
  const int slot = static_cast<int>(layer % 2);
  if (plan_.layer_split && e.made && e.prefetched_layer[slot] == layer)
    MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.prefetched[slot], 0));
}

bool CudaDsaModel::sends_selected_entries(const Step& step, const PagedKvCache& cache) const {
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
  SplitEntries& e = split_entries();
  const bool mine = owner == plan_.tensor_parallel_rank;
  const LayerSlots selected = layer_slots(step);  // the same slots on every rank
  const int64_t entries = step.tokens * selected.top_k;
  const int slot = e.next;
  e.next ^= 1;
  // The slot's last broadcast (two layers ago) is over before it is refilled
  // (one of an earlier step was joined at its end: join_layer_split_side).
  if (e.received_pending[slot])
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
  e.received_pending[slot] = true;
  if (!mine) {
    e.layer = layer;
    e.slot = slot;
  }
}

void CudaDsaModel::join_layer_split_side() {
  SplitEntries& e = split_entries_;
  if (!plan_.layer_split || !e.made) return;
  for (int s = 0; s < 2; ++s) {
    if (e.received_pending[s]) MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.received[s], 0));
    if (e.prefetched_layer[s] >= 0)
      MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.prefetched[s], 0));
    e.received_pending[s] = false;
    e.prefetched_layer[s] = -1;
  }
}

std::optional<CudaDsaModel::BorrowedEntries> CudaDsaModel::borrowed_entries(int64_t layer) {
  SplitEntries& e = split_entries_;
  if (e.layer != layer) return std::nullopt;
  MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.received[e.slot], 0));
  return BorrowedEntries{e.rows[e.slot].as<uint8_t>(), e.slots.as<int32_t>()};
}

const void* CudaDsaModel::latent_pool_of(const PagedKvCache& cache, int64_t layer) const {
  if (layer == borrowed_layer_)
    return split_entries_.pools[split_entries_.borrowed_pool].as<uint8_t>();
  return cache.latent_pool(layer).raw();
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
