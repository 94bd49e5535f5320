// Decode steps of the CUDA model as CUDA Graphs, one per bucket: the batch is
// padded to a batch-size bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, ...)
// and the context to a power of two, so that a handful of graphs serve every
// decode step. Host launch overhead (hundreds of kernels and cuBLAS calls per
// step) dominates small-batch decode; a replay is one launch.
//
// How a step runs (CudaDsaModel::forward_graph):
//   1. the host packs the step's inputs (token ids, positions, page tables,
//      RoPE tables, logit rows; DecodeInputLayout) into pinned staging and
//      uploads them with one copy into a fixed device block, outside the graph;
//   2. the graph of the step's DecodeGraphKey replays, reading that block; a
//      key seen for the first time runs eagerly (which also sizes every
//      grow-only scratch buffer for that shape) and is then captured;
//   3. the logits (and hidden states) of the real rows are copied out.
// Padding rows have position -1: they write no KV entry and attend to
// nothing (kernels/cuda/dsa_fallback/dsa_fallback.h).
//
// A graph holds the addresses it was captured with (scratch, cuBLAS scratch,
// the input block, the KV pools). It is dropped and captured again when any
// DeviceBuffer was freed since (DeviceBuffer::releases()) or the model's
// Blas reallocated a scratch (Blas::reallocations()): the scratch epoch.
// Only included by CUDA builds (MEGACTX_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/cuda/dsa_fallback/dsa_fallback.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/decode_graph_plan.h"
#include "model/cuda/device_buffer.h"

namespace megactx::cuda {

// The device entry layouts of `cache`'s latent and indexer pools, checked
// byte for byte against the cache's own (kv_cache.h).
struct CacheLayouts {
  CacheLayout latent, indexer;
};
CacheLayouts cache_layouts(const KvCacheSpec& spec);
// A hash of the page size and the pool addresses of layers [0, layers): a
// graph writes the pools it was captured with, so another cache (or a moved
// pool) needs another graph.
uint64_t cache_fingerprint(const PagedKvCache& cache, int64_t layers);

class DecodeGraphCache {
 public:
  DecodeGraphCache() = default;
  ~DecodeGraphCache();
  DecodeGraphCache(const DecodeGraphCache&) = delete;
  DecodeGraphCache& operator=(const DecodeGraphCache&) = delete;

  // Drops every graph when `epoch` differs from the one they were captured at.
  void sync_epoch(uint64_t epoch);
  // The graph of `key`, or nullptr (not captured yet, or capture failed).
  cudaGraphExec_t find(const DecodeGraphKey& key) const;
  bool failed(const DecodeGraphKey& key) const { return failed_.count(key) > 0; }
  // Captures the work `record` launches on `stream` (nothing executes) as the
  // graph of `key` at `epoch`. A capture that fails (an illegal call inside,
  // e.g. a host synchronisation) is discarded, the key is remembered as
  // failed and false is returned; the stream is usable again.
  bool capture(const DecodeGraphKey& key, uint64_t epoch, cudaStream_t stream,
               const std::function<void()>& record);
  void launch(cudaGraphExec_t graph, cudaStream_t stream);
  void clear();
  void count_eager_step() { ++stats_.eager_steps; }

  CudaGraphStats stats() const;
  // The packed inputs: pinned host staging and the fixed device block the
  // graphs read (a DeviceBuffer: its growth counts as a release).
  PinnedBuffer& staging() { return staging_; }
  DeviceBuffer& inputs() { return inputs_; }

 private:
  std::map<DecodeGraphKey, cudaGraphExec_t> graphs_;
  std::set<DecodeGraphKey> failed_;
  uint64_t epoch_ = 0;
  PinnedBuffer staging_;
  DeviceBuffer inputs_;
  CudaGraphStats stats_;
};

}  // namespace megactx::cuda
