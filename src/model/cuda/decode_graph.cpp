#if MEGACTX_HAVE_CUDA
#include "model/cuda/decode_graph.h"

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

CacheLayouts cache_layouts(const KvCacheSpec& spec) {
  const CacheDType dtype = spec.dtype == KvDType::F32    ? CacheDType::F32
                           : spec.dtype == KvDType::BF16 ? CacheDType::BF16
                                                         : CacheDType::FP8;
  CacheLayouts out;
  out.latent = {dtype, spec.kv_lora_rank + spec.qk_rope_head_dim, spec.kv_lora_rank};
  out.indexer = {dtype, spec.index_head_dim, spec.index_head_dim};
  // The device layouts must be the cache's (kv_cache.h) byte for byte.
  MEGACTX_CHECK(out.latent.bytes() == spec.latent_bytes_per_token() &&
                    out.indexer.bytes() == spec.indexer_bytes_per_token(),
                "CUDA model: KV entry layout mismatch ({} / {} B vs {} / {} B)", out.latent.bytes(),
                out.indexer.bytes(), spec.latent_bytes_per_token(), spec.indexer_bytes_per_token());
  return out;
}

uint64_t cache_fingerprint(const PagedKvCache& cache, int64_t layers) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  auto mix = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xffu;
      hash *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(cache.spec().page_size));
  for (int64_t layer = 0; layer < layers; ++layer) {
    mix(reinterpret_cast<uintptr_t>(cache.latent_pool(layer).raw()));
    if (cache.has_indexer(layer)) mix(reinterpret_cast<uintptr_t>(cache.indexer_pool(layer).raw()));
  }
  return hash;
}

DecodeGraphCache::~DecodeGraphCache() {
  clear();
}

void DecodeGraphCache::clear() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph);
  graphs_.clear();
  // A failed key may capture once its cause (e.g. a buffer growing inside
  // the capture) is gone.
  failed_.clear();
}

void DecodeGraphCache::sync_epoch(uint64_t epoch) {
  if (epoch == epoch_) return;
  if (!graphs_.empty()) ++stats_.invalidations;
  clear();
  epoch_ = epoch;
}

cudaGraphExec_t DecodeGraphCache::find(const DecodeGraphKey& key) const {
  const auto it = graphs_.find(key);
  return it == graphs_.end() ? nullptr : it->second;
}

bool DecodeGraphCache::capture(const DecodeGraphKey& key, uint64_t epoch, cudaStream_t stream,
                               const std::function<void()>& record) {
  sync_epoch(epoch);
  // Thread-local mode: another thread's unrelated CUDA calls (a server
  // thread freeing a logits tensor) cannot invalidate this capture, while an
  // illegal call of this thread inside it (a synchronisation, an allocation)
  // still fails it.
  MEGACTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bool recorded = true;
  try {
    record();
  } catch (const std::exception&) {
    recorded = false;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  bool ok = recorded && ended == cudaSuccess && graph != nullptr;
  if (ok) ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!ok) {
    // Clear the sticky-free error a failed capture leaves for the next check.
    (void)cudaGetLastError();
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    failed_.insert(key);
    ++stats_.failed_captures;
    return false;
  }
  graphs_[key] = exec;
  ++stats_.captures;
  return true;
}

void DecodeGraphCache::launch(cudaGraphExec_t graph, cudaStream_t stream) {
  MEGACTX_CUDA_CHECK(cudaGraphLaunch(graph, stream));
  ++stats_.replays;
}

CudaGraphStats DecodeGraphCache::stats() const {
  CudaGraphStats out = stats_;
  out.cached = static_cast<int64_t>(graphs_.size());
  return out;
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
