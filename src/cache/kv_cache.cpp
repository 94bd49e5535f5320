// Host implementation of the paged latent / indexer-key pools and their
// per-token encodings (F32, BF16, FP8 e4m3 with per-128 fp32 scales).
#include "cache/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace megactx {
namespace {

constexpr int64_t kFp8Group = 128;

int64_t fp8_groups(int64_t n) {
  return (n + kFp8Group - 1) / kFp8Group;
}

// Encodes n floats as e4m3 with one fp32 scale per 128 values:
// [n x e4m3][groups x f32]. scale = amax / 448 (1 for an all-zero group).
void encode_fp8(const float* values, int64_t n, std::byte* out) {
  auto* codes = reinterpret_cast<uint8_t*>(out);
  std::byte* scales = out + n;
  for (int64_t g = 0; g < fp8_groups(n); ++g) {
    const int64_t begin = g * kFp8Group;
    const int64_t end = std::min(n, begin + kFp8Group);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(values[i]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t i = begin; i < end; ++i) codes[i] = float_to_fp8_e4m3(values[i] / scale);
    std::memcpy(scales + g * 4, &scale, 4);
  }
}

void decode_fp8(const std::byte* in, int64_t n, float* values) {
  const auto* codes = reinterpret_cast<const uint8_t*>(in);
  const std::byte* scales = in + n;
  for (int64_t g = 0; g < fp8_groups(n); ++g) {
    float scale;
    std::memcpy(&scale, scales + g * 4, 4);
    const int64_t end = std::min(n, (g + 1) * kFp8Group);
    for (int64_t i = g * kFp8Group; i < end; ++i) values[i] = fp8_e4m3_to_float(codes[i]) * scale;
  }
}

void encode_plain(const float* values, int64_t n, KvDType dtype, std::byte* out) {
  if (dtype == KvDType::F32) {
    std::memcpy(out, values, static_cast<size_t>(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t bits = float_to_bf16(values[i]);
      std::memcpy(out + 2 * i, &bits, 2);
    }
  }
}

void decode_plain(const std::byte* in, int64_t n, KvDType dtype, float* values) {
  if (dtype == KvDType::F32) {
    std::memcpy(values, in, static_cast<size_t>(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, in + 2 * i, 2);
      values[i] = bf16_to_float(bits);
    }
  }
}

std::vector<int64_t> index_layers(const std::vector<int64_t>& layers, const char* what) {
  int64_t max_layer = -1;
  for (int64_t layer : layers) {
    MEGACTX_CHECK(layer >= 0, "KV cache: negative {} layer id {}", what, layer);
    max_layer = std::max(max_layer, layer);
  }
  std::vector<int64_t> index(static_cast<size_t>(max_layer + 1), -1);
  for (size_t i = 0; i < layers.size(); ++i) {
    MEGACTX_CHECK(index[layers[i]] < 0, "KV cache: {} layer {} listed twice", what, layers[i]);
    index[layers[i]] = static_cast<int64_t>(i);
  }
  return index;
}

}  // namespace

int64_t KvCacheSpec::latent_bytes_per_token() const {
  switch (dtype) {
    case KvDType::F32:
      return (kv_lora_rank + qk_rope_head_dim) * 4;
    case KvDType::BF16:
      return (kv_lora_rank + qk_rope_head_dim) * 2;
    case KvDType::FP8:
      return kv_lora_rank + 4 * fp8_groups(kv_lora_rank) + 2 * qk_rope_head_dim;
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
      return index_head_dim + 4 * fp8_groups(index_head_dim);
  }
  return 0;
}

int64_t KvCacheSpec::bytes_per_page() const {
  return latent_bytes_per_page() + indexer_bytes_per_page() +
         borrowed_latent_pools * page_size * latent_bytes_per_token();
}

int64_t KvCacheSpec::latent_bytes_per_page() const {
  return page_size * static_cast<int64_t>(latent_layers.size()) * latent_bytes_per_token();
}

int64_t KvCacheSpec::indexer_bytes_per_page() const {
  return page_size * static_cast<int64_t>(indexer_layers.size()) * indexer_bytes_per_token();
}

PagedKvCache::PagedKvCache(KvCacheSpec spec) : spec_(std::move(spec)) {
  MEGACTX_CHECK(spec_.device == Device::CPU,
                "PagedKvCache(spec) allocates host memory; build device pools with from_storage");
  MEGACTX_CHECK(spec_.num_pages >= 0 && spec_.offload_pages >= 0 && spec_.page_size > 0,
                "KV cache: bad num_pages {} / offload_pages {} / page_size {}", spec_.num_pages,
                spec_.offload_pages, spec_.page_size);
  MEGACTX_CHECK(spec_.kv_lora_rank > 0 && spec_.qk_rope_head_dim >= 0,
                "KV cache: bad kv_lora_rank {} / qk_rope_head_dim {}", spec_.kv_lora_rank,
                spec_.qk_rope_head_dim);
  MEGACTX_CHECK(spec_.indexer_layers.empty() || spec_.index_head_dim > 0,
                "KV cache: indexer layers need index_head_dim > 0");
  latent_index_ = index_layers(spec_.latent_layers, "latent");
  indexer_index_ = index_layers(spec_.indexer_layers, "indexer");
  const int64_t slots = spec_.num_pages * spec_.page_size;
  const int64_t offload_slots = spec_.offload_pages * spec_.page_size;
  for (size_t i = 0; i < spec_.latent_layers.size(); ++i) {
    latent_pools_.push_back(Tensor::zeros({slots, spec_.latent_bytes_per_token()}, DType::U8));
    if (offload_slots > 0) {
      offload_latent_pools_.push_back(
          Tensor::zeros({offload_slots, spec_.latent_bytes_per_token()}, DType::U8));
    }
  }
  for (size_t i = 0; i < spec_.indexer_layers.size(); ++i) {
    indexer_pools_.push_back(
        Tensor::zeros({slots + offload_slots, spec_.indexer_bytes_per_token()}, DType::U8));
  }
}

PagedKvCache::PagedKvCache(KvCacheSpec spec, std::vector<Tensor> latent_pools,
                           std::vector<Tensor> indexer_pools,
                           std::vector<Tensor> offload_latent_pools)
    : spec_(std::move(spec)),
      latent_pools_(std::move(latent_pools)),
      indexer_pools_(std::move(indexer_pools)),
      offload_latent_pools_(std::move(offload_latent_pools)) {
  latent_index_ = index_layers(spec_.latent_layers, "latent");
  indexer_index_ = index_layers(spec_.indexer_layers, "indexer");
  MEGACTX_CHECK(latent_pools_.size() == spec_.latent_layers.size() &&
                    indexer_pools_.size() == spec_.indexer_layers.size(),
                "KV cache: {} latent / {} indexer pools for {} / {} layers", latent_pools_.size(),
                indexer_pools_.size(), spec_.latent_layers.size(), spec_.indexer_layers.size());
  MEGACTX_CHECK(offload_latent_pools_.size() ==
                    (spec_.offload_pages > 0 ? spec_.latent_layers.size() : size_t{0}),
                "KV cache: {} offload latent pools for {} layers and {} offload pages",
                offload_latent_pools_.size(), spec_.latent_layers.size(), spec_.offload_pages);
  const int64_t slots = spec_.num_pages * spec_.page_size;
  const int64_t offload_slots = spec_.offload_pages * spec_.page_size;
  for (const Tensor& pool : latent_pools_)
    MEGACTX_CHECK(pool.dim(0) == slots, "KV cache: a latent pool of {} slots, not {}", pool.dim(0),
                  slots);
  for (const Tensor& pool : offload_latent_pools_)
    MEGACTX_CHECK(pool.dim(0) == offload_slots && pool.device() == Device::CPU,
                  "KV cache: an offload latent pool of {} slots on the {}, not {} in host memory",
                  pool.dim(0), pool.device() == Device::CPU ? "host" : "device", offload_slots);
  for (const Tensor& pool : indexer_pools_)
    MEGACTX_CHECK(pool.dim(0) == slots + offload_slots,
                  "KV cache: an indexer pool of {} slots, not {}", pool.dim(0),
                  slots + offload_slots);
}

bool PagedKvCache::has_latent(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(latent_index_.size()) &&
         latent_index_[layer] >= 0;
}

bool PagedKvCache::has_indexer(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(indexer_index_.size()) &&
         indexer_index_[layer] >= 0;
}

const Tensor& PagedKvCache::latent_pool(int64_t layer) const {
  MEGACTX_CHECK(has_latent(layer), "KV cache: layer {} has no latent pool", layer);
  return latent_pools_[latent_index_[layer]];
}

const Tensor& PagedKvCache::indexer_pool(int64_t layer) const {
  MEGACTX_CHECK(has_indexer(layer), "KV cache: layer {} has no indexer-key pool", layer);
  return indexer_pools_[indexer_index_[layer]];
}

const Tensor& PagedKvCache::offload_latent_pool(int64_t layer) const {
  MEGACTX_CHECK(has_latent(layer) && spec_.offload_pages > 0,
                "KV cache: layer {} has no offload latent pool", layer);
  return offload_latent_pools_[latent_index_[layer]];
}

std::byte* PagedKvCache::latent_entry(int64_t layer, int64_t slot) {
  const int64_t slots = spec_.num_pages * spec_.page_size;
  MEGACTX_CHECK(slot >= 0 && slot < spec_.total_pages() * spec_.page_size,
                "KV cache: slot {} out of range [0, {})", slot,
                spec_.total_pages() * spec_.page_size);
  if (slot >= slots) {
    return offload_latent_pool(layer).data<std::byte>() +
           (slot - slots) * spec_.latent_bytes_per_token();
  }
  return latent_pool(layer).data<std::byte>() + slot * spec_.latent_bytes_per_token();
}

const std::byte* PagedKvCache::latent_page(int64_t layer, int64_t page) const {
  return const_cast<PagedKvCache*>(this)->latent_entry(layer, page * spec_.page_size);
}

const std::byte* PagedKvCache::indexer_page(int64_t layer, int64_t page) const {
  return const_cast<PagedKvCache*>(this)->indexer_entry(layer, page * spec_.page_size);
}

std::byte* PagedKvCache::indexer_entry(int64_t layer, int64_t slot) {
  const Tensor& pool = indexer_pool(layer);
  MEGACTX_CHECK(slot >= 0 && slot < pool.dim(0), "KV cache: slot {} out of range [0, {})", slot,
                pool.dim(0));
  return pool.data<std::byte>() + slot * spec_.indexer_bytes_per_token();
}

void PagedKvCache::write_latent(int64_t layer, int64_t slot, const float* c_kv,
                                const float* k_rope) {
  std::byte* entry = latent_entry(layer, slot);
  const int64_t lora = spec_.kv_lora_rank;
  const int64_t rope = spec_.qk_rope_head_dim;
  if (spec_.dtype == KvDType::FP8) {
    encode_fp8(c_kv, lora, entry);
    encode_plain(k_rope, rope, KvDType::BF16, entry + lora + 4 * fp8_groups(lora));
  } else {
    const int64_t width = spec_.dtype == KvDType::F32 ? 4 : 2;
    encode_plain(c_kv, lora, spec_.dtype, entry);
    encode_plain(k_rope, rope, spec_.dtype, entry + lora * width);
  }
}

void PagedKvCache::read_latent(int64_t layer, int64_t slot, float* c_kv, float* k_rope) const {
  decode_latent_entry(spec_, const_cast<PagedKvCache*>(this)->latent_entry(layer, slot), c_kv,
                      k_rope);
}

void decode_latent_entry(const KvCacheSpec& spec, const std::byte* entry, float* c_kv,
                         float* k_rope) {
  const int64_t lora = spec.kv_lora_rank;
  const int64_t rope = spec.qk_rope_head_dim;
  if (spec.dtype == KvDType::FP8) {
    decode_fp8(entry, lora, c_kv);
    decode_plain(entry + lora + 4 * fp8_groups(lora), rope, KvDType::BF16, k_rope);
  } else {
    const int64_t width = spec.dtype == KvDType::F32 ? 4 : 2;
    decode_plain(entry, lora, spec.dtype, c_kv);
    decode_plain(entry + lora * width, rope, spec.dtype, k_rope);
  }
}

void PagedKvCache::write_indexer_key(int64_t layer, int64_t slot, const float* key) {
  std::byte* entry = indexer_entry(layer, slot);
  if (spec_.dtype == KvDType::FP8) {
    encode_fp8(key, spec_.index_head_dim, entry);
  } else {
    encode_plain(key, spec_.index_head_dim, spec_.dtype, entry);
  }
}

void PagedKvCache::read_indexer_key(int64_t layer, int64_t slot, float* key) const {
  const std::byte* entry = const_cast<PagedKvCache*>(this)->indexer_entry(layer, slot);
  if (spec_.dtype == KvDType::FP8) {
    decode_fp8(entry, spec_.index_head_dim, key);
  } else {
    decode_plain(entry, spec_.index_head_dim, spec_.dtype, key);
  }
}

void PagedKvCache::copy_page(int64_t source, int64_t destination) {
  MEGACTX_CHECK(spec_.device == Device::CPU, "KV cache: copy_page on the host needs host pools");
  const int64_t pages = spec_.total_pages();
  MEGACTX_CHECK(source >= 0 && source < pages && destination >= 0 && destination < pages,
                "KV cache: copy_page {} -> {} outside [0, {})", source, destination, pages);
  if (source == destination) return;
  const auto latent_bytes = static_cast<size_t>(spec_.page_size * spec_.latent_bytes_per_token());
  const auto indexer_bytes = static_cast<size_t>(spec_.page_size * spec_.indexer_bytes_per_token());
  for (const int64_t layer : spec_.latent_layers) {
    std::memcpy(latent_entry(layer, destination * spec_.page_size), latent_page(layer, source),
                latent_bytes);
  }
  for (const int64_t layer : spec_.indexer_layers) {
    std::memcpy(indexer_entry(layer, destination * spec_.page_size), indexer_page(layer, source),
                indexer_bytes);
  }
}

}  // namespace megactx
