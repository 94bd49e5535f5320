// TEMPORARY: only compiled while src/cache/kv_cache.cpp (the forward-pass
// engineer's) has not landed, so the engine tests link. The byte counts follow
// the layouts documented in cache/kv_cache.h; no storage is allocated (the
// fake models keep their own).
#include "cache/kv_cache.h"

namespace megactx {

int64_t KvCacheSpec::latent_bytes_per_token() const {
  switch (dtype) {
    case KvDType::F32:
      return (kv_lora_rank + qk_rope_head_dim) * 4;
    case KvDType::BF16:
      return (kv_lora_rank + qk_rope_head_dim) * 2;
    case KvDType::FP8:
      return kv_lora_rank + kv_lora_rank / 128 * 4 + qk_rope_head_dim * 2;
  }
  return 0;
}

int64_t KvCacheSpec::indexer_bytes_per_token() const {
  switch (dtype) {
    case KvDType::F32:
      return index_head_dim * 4;
    case KvDType::BF16:
      return index_head_dim * 2;
    case KvDType::FP8:
      return index_head_dim + 4;
  }
  return 0;
}

int64_t KvCacheSpec::bytes_per_page() const {
  return page_size * (static_cast<int64_t>(latent_layers.size()) * latent_bytes_per_token() +
                      static_cast<int64_t>(indexer_layers.size()) * indexer_bytes_per_token());
}

PagedKvCache::PagedKvCache(KvCacheSpec spec) : spec_(std::move(spec)) {}

}  // namespace megactx
