// KV capacity planning: turns a memory budget into pages. Every page holds
// `page_size` tokens in *every* pool (so one page id covers a token range of
// all layers): a latent pool per attention layer (+ the MTP layer when
// speculative decoding is on) and an indexer-key pool only for layers that
// run an indexer (+ the MTP layer, which always has its own indexer).
#pragma once

#include <cstdint>
#include <string>

#include "cache/kv_cache.h"
#include "io/model_config.h"

namespace megactx {

struct KvCapacityPlan {
  KvCacheSpec spec;             // num_pages filled in
  int64_t bytes_per_page = 0;   // all pools
  int64_t bytes_per_token = 0;  // bytes_per_page / page_size
  int64_t total_bytes = 0;      // num_pages * bytes_per_page (<= the budget)
  int64_t max_tokens = 0;       // num_pages * page_size
  std::string summary() const;  // one log line
};

// Throws megactx::Error when the budget holds less than one page.
KvCapacityPlan plan_kv_capacity(const ModelConfig& model, KvDType dtype, int64_t memory_bytes,
                                int64_t page_size, bool with_mtp_layer);

// "f32" | "bf16" | "fp8" (parse_kv_dtype is in model/model_loader.h).
const char* kv_dtype_name(KvDType dtype);

}  // namespace megactx
