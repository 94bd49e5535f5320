// Device memory plan of the CUDA model, from a budget: the weights, the
// per-step scratch for the largest step (tokens x context), and what is left
// for KV pages. Plain C++ (no CUDA): the engine asks it before allocating, and
// start-up fails with a clear Error when the model does not fit.
#pragma once

#include <cstdint>

#include "cache/kv_cache.h"
#include "io/model_config.h"

namespace megactx {

struct CudaMemoryRequest {
  int64_t budget_bytes = 0;     // device memory the model may use in all
  int64_t weight_bytes = 0;     // as uploaded (fp32 parity mode: 4 B per parameter)
  int64_t max_step_tokens = 0;  // most new tokens in one forward (all sequences)
  int64_t max_context = 0;      // longest sequence (start + new tokens)
  int64_t max_logit_rows = 0;   // most rows that want logits in one forward
  int64_t index_topk = 0;
  KvCacheSpec kv;  // layers, dims, dtype, page_size (num_pages ignored)
};

struct CudaMemoryPlan {
  int64_t weight_bytes = 0;
  int64_t scratch_bytes = 0;  // activations + indexer scores of the largest step
  int64_t kv_bytes_per_page = 0;
  int64_t kv_pages = 0;  // pages that fit in what is left
};

// Bytes of CudaDsaModel's step scratch (cuda_dsa_model.h) for `tokens` new
// tokens over contexts up to `max_context`, `logit_rows` of them wanting logits.
int64_t cuda_step_scratch_bytes(const ModelConfig& config, int64_t tokens, int64_t max_context,
                                int64_t logit_rows, int64_t index_topk);

// Throws megactx::Error naming the numbers when weights + scratch exceed the
// budget or no page of max_context fits.
CudaMemoryPlan plan_cuda_memory(const ModelConfig& config, const CudaMemoryRequest& request);

struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// cudaMemGetInfo of `device_ordinal` (its context is created first, so two
// calls around a model load differ by what the load allocated). An Error in
// builds without CUDA or when the device is missing.
DeviceMemoryInfo query_device_memory(int device_ordinal = 0);

}  // namespace megactx
