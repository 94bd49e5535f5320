// The device cache writes (kernels/cuda/dsa_fallback write_cache_rows) against the
// host encoder of cache/kv_cache.cpp: the same bytes for every entry, in the
// F32, BF16 and FP8 layouts, for the fixtures' tiny widths, the default
// model's, GLM-5's real ones (512 + 64 latent, 128 indexer keys), ragged fp8
// groups and entries the warp-per-group FP8 writer leaves to the plain one. Prefill and decode on
// either backend read these bytes, so equal bytes are what parity needs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/dsa_fallback/dsa_fallback.h"

namespace megactx::testing {
namespace {

template <typename T>
T* to_device(const std::vector<T>& host) {
  T* data = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(1, host.size() * sizeof(T))));
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return data;
}

cuda::CacheDType device_dtype(KvDType dtype) {
  return dtype == KvDType::F32    ? cuda::CacheDType::F32
         : dtype == KvDType::BF16 ? cuda::CacheDType::BF16
                                  : cuda::CacheDType::FP8;
}

// Writes `tokens` rows at scattered positions of a 3-page table on both sides
// and compares the pools byte for byte.
void check_layout(KvDType dtype, int64_t lora, int64_t rope, int64_t index_dim) {
  KvCacheSpec spec;
  spec.num_pages = 4;
  spec.page_size = 16;
  spec.kv_lora_rank = lora;
  spec.qk_rope_head_dim = rope;
  spec.index_head_dim = index_dim;
  spec.latent_layers = {0};
  spec.indexer_layers = {0};
  spec.dtype = dtype;
  PagedKvCache host(spec);

  const std::vector<int32_t> table = {2, 0, 3};
  const std::vector<int32_t> positions = {0, 5, 15, 16, 17, 31, 32, 40};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const int64_t entry = lora + rope;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> latent(static_cast<size_t>(tokens * entry)),
      keys(static_cast<size_t>(tokens * index_dim));
  for (float& v : latent) v = normal(rng) * 3.0f;
  for (float& v : keys) v = normal(rng);
  for (int64_t d = 0; d < lora; ++d)
    latent[static_cast<size_t>(2 * entry + d)] = 0.0f;  // zero group

  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = positions[static_cast<size_t>(t)];
    const int64_t slot =
        table[static_cast<size_t>(p / spec.page_size)] * spec.page_size + p % spec.page_size;
    host.write_latent(0, slot, latent.data() + t * entry, latent.data() + t * entry + lora);
    host.write_indexer_key(0, slot, keys.data() + t * index_dim);
  }

  const std::vector<int32_t> offsets(static_cast<size_t>(tokens), 0);
  cuda::PagedRows rows;
  rows.page_tables = to_device(table);
  rows.table_offset = to_device(offsets);
  rows.positions = to_device(positions);
  rows.page_size = spec.page_size;
  const int64_t slots = spec.num_pages * spec.page_size;
  const cuda::CacheLayout latent_layout{device_dtype(dtype), entry, lora};
  const cuda::CacheLayout key_layout{device_dtype(dtype), index_dim, index_dim};
  ASSERT_EQ(latent_layout.bytes(), spec.latent_bytes_per_token());
  ASSERT_EQ(key_layout.bytes(), spec.indexer_bytes_per_token());
  std::vector<uint8_t> zeros_latent(static_cast<size_t>(slots * latent_layout.bytes()), 0);
  std::vector<uint8_t> zeros_key(static_cast<size_t>(slots * key_layout.bytes()), 0);
  uint8_t* latent_pool = to_device(zeros_latent);
  uint8_t* key_pool = to_device(zeros_key);
  float* d_latent = to_device(latent);
  float* d_keys = to_device(keys);
  cuda::write_cache_rows(latent_pool, latent_layout, rows, tokens, d_latent, entry, nullptr);
  cuda::write_cache_rows(key_pool, key_layout, rows, tokens, d_keys, index_dim, nullptr);
  MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<uint8_t> got_latent(zeros_latent.size()), got_key(zeros_key.size());
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(got_latent.data(), latent_pool, got_latent.size(), cudaMemcpyDeviceToHost));
  MEGACTX_CUDA_CHECK(cudaMemcpy(got_key.data(), key_pool, got_key.size(), cudaMemcpyDeviceToHost));
  const auto* want_latent = reinterpret_cast<const uint8_t*>(host.latent_entry(0, 0));
  const auto* want_key = reinterpret_cast<const uint8_t*>(host.indexer_entry(0, 0));
  int64_t latent_diffs = 0, key_diffs = 0;
  for (size_t i = 0; i < got_latent.size(); ++i) {
    if (got_latent[i] != want_latent[i] && latent_diffs++ < 8) {
      const size_t slot = i / static_cast<size_t>(latent_layout.bytes());
      ADD_FAILURE() << "latent slot " << slot << " byte " << i % latent_layout.bytes()
                    << ": device " << int{got_latent[i]} << " host " << int{want_latent[i]};
    }
  }
  for (size_t i = 0; i < got_key.size(); ++i) key_diffs += got_key[i] != want_key[i];
  EXPECT_EQ(latent_diffs, 0) << "dtype " << static_cast<int>(dtype) << " lora " << lora;
  EXPECT_EQ(key_diffs, 0) << "dtype " << static_cast<int>(dtype) << " index_dim " << index_dim;
  for (void* p :
       {static_cast<void*>(latent_pool), static_cast<void*>(key_pool), static_cast<void*>(d_latent),
        static_cast<void*>(d_keys), const_cast<void*>(static_cast<const void*>(rows.page_tables)),
        const_cast<void*>(static_cast<const void*>(rows.table_offset)),
        const_cast<void*>(static_cast<const void*>(rows.positions))}) {
    cudaFree(p);
  }
}

TEST(CudaKvEncoding, DeviceWritesTheHostBytes) {
  for (KvDType dtype : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    check_layout(dtype, 32, 8, 16);     // the HF fixtures
    check_layout(dtype, 512, 64, 128);  // GLM-5 / DeepSeek-V3.2
    check_layout(dtype, 128, 32, 64);   // the default model
    // A short last group (200 = 128 + 72 codes, 136 = 128 + 8), and entries that
    // are not 4-byte multiples (30 + 6 latent: the thread-per-group FP8 kernel).
    check_layout(dtype, 200, 8, 136);
    check_layout(dtype, 30, 6, 10);
  }
}

}  // namespace
}  // namespace megactx::testing
