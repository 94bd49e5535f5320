// KV capacity planning: turns a memory budget into pages. Every page holds
// `page_size` tokens in *every* pool (so one page id covers a token range of
// all layers): a latent pool per attention layer (+ the MTP layer when
// speculative decoding is on) and an indexer-key pool only for layers that
// run an indexer (+ the MTP layer, which always has its own indexer).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/engine_config.h"
#include "io/model_config.h"
#include "model/cuda/memory_plan.h"

namespace megactx {

struct KvCapacityPlan {
  KvCacheSpec spec;             // the whole model's pools, num_pages filled in (every rank's)
  int64_t bytes_per_page = 0;   // all pools a rank holds (the largest rank's share)
  int64_t bytes_per_token = 0;  // bytes_per_page / page_size
  int64_t total_bytes = 0;      // pages_per_rank * bytes_per_page (<= the budget), per rank
  int64_t max_tokens = 0;       // pages_per_rank * page_size: the longest sequence
  // Data-parallel attention: each of `data_parallel_ranks` ranks holds
  // pages_per_rank pages of its own requests (the budget is per rank), and
  // spec.num_pages numbers them all (rank r's are [r * pages_per_rank, ...)).
  int data_parallel_ranks = 1;
  int64_t pages_per_rank = 0;
  // LayerSplit (one entry per rank, else empty): each rank's pools.
  std::vector<KvCacheSpec> shares;
  std::string summary() const;  // one log line
};

// The pools each rank of a model's group allocates for the whole spec
// (LanguageModel::kv_cache_shares).
using KvCacheShares = std::function<std::vector<KvCacheSpec>(const KvCacheSpec& whole)>;

// `memory_bytes` is each rank's budget: with `shares` (LayerSplit) the rank
// with the most bytes per page bounds the pages (every rank numbers them
// alike); with `data_parallel_ranks` > 1 every rank gets the pages of that
// budget for its own requests. Throws megactx::Error when the budget holds
// less than one page.
KvCapacityPlan plan_kv_capacity(const ModelConfig& model, KvDType dtype, int64_t memory_bytes,
                                int64_t page_size, bool with_mtp_layer,
                                const KvCacheShares& shares = {}, int data_parallel_ranks = 1);

// ---- --device cuda: KV pages from the device's memory ----
//
// vLLM's --gpu-memory-utilization: the whole process may use `fraction` of
// the device's total memory; what loading the model took (measured), the
// largest step's scratch (model/cuda/memory_plan.h) and a reserve for the
// runtime come off first, the KV pools get the rest. An explicit KV budget
// (--kv-memory) replaces the fraction. Either way the plan must fit in what
// the device has free now, and hold one sequence of the full context.
struct DeviceKvRequest {
  DeviceMemoryInfo memory;  // after the model was loaded
  int64_t model_bytes = 0;  // what the load allocated on the device
  double gpu_memory_utilization = 0.9;
  int64_t kv_memory_bytes = 0;  // > 0: this KV budget instead of the fraction's rest
  // The loaded model's options (fast attention, device MoE, CUDA graphs, the
  // device's SMs); plan_device_kv fills decode_sequences and
  // decode_tokens_per_sequence from the EngineConfig. model_bytes is measured
  // around the load, so it already holds the fixed cuBLAS workspace.
  CudaScratchOptions options;
};

struct DeviceKvPlan {
  CudaMemoryPlan memory;      // model (as weight_bytes), scratch and its parts, page bytes, pages
  int64_t budget_bytes = 0;   // what the process may use in all
  int64_t reserve_bytes = 0;  // cuBLAS workspace, sampler, allocation rounding
  int64_t max_step_tokens = 0;
  int64_t context = 0;
  // True when `context` is less than the model's max_position_embeddings
  // because the KV budget holds no longer sequence (only where no
  // --context-length was given; the engine then takes `context`).
  bool context_fitted = false;
  DeviceMemoryInfo device;  // as measured after the model was loaded
  int64_t kv_bytes() const { return memory.kv_pages * memory.kv_bytes_per_page; }
  std::string summary() const;  // one log line
};

// Room for the runtime besides model, scratch and pools (see DeviceKvPlan).
int64_t device_reserve_bytes(const KvCacheSpec& spec);

// The step the engine can run at most: max_prefill_tokens of prefill plus one
// decode token per running request, every one possibly wanting logits
// (scoring), at the engine's context length. Throws megactx::Error naming the
// numbers when the model does not fit, the KV budget holds no full-context
// sequence, or the device has less free memory than the plan needs.
DeviceKvPlan plan_device_kv(const ModelConfig& model, const EngineConfig& engine,
                            const DeviceKvRequest& request);

// "f32" | "bf16" | "fp8" (parse_kv_dtype is in model/model_loader.h).
const char* kv_dtype_name(KvDType dtype);

}  // namespace megactx
