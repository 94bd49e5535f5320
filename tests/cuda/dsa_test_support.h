// Helpers of the GPU DSA tests: device buffers, random paged caches built with
// the fp32 references' encoders, and block tables over shuffled pages.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/reference/indexer_topk_reference.h"
#include "kernels/reference/sparse_mla_reference.h"

namespace megactx::test {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    MEGACTX_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  T* get() const { return data_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
    MEGACTX_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void fill_bytes(int value) {
    MEGACTX_CUDA_CHECK(cudaMemset(data_, value, std::max<size_t>(count_, 1) * sizeof(T)));
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

// Requests with their own lengths over one pool of shuffled pages.
struct PagedLayout {
  int block_table_stride = 0;
  std::vector<int32_t> block_table;  // [requests, block_table_stride]
  int64_t num_pages = 0;
};

inline PagedLayout make_paged_layout(const std::vector<int64_t>& lengths, std::mt19937& rng) {
  PagedLayout layout;
  int64_t most = 1;
  for (int64_t length : lengths) most = std::max<int64_t>(most, (length + 63) / 64);
  layout.block_table_stride = static_cast<int>(most);
  int64_t total = 0;
  for (int64_t length : lengths) total += (length + 63) / 64;
  layout.num_pages = total + 3;  // a few pages nobody uses
  std::vector<int32_t> pages(static_cast<size_t>(layout.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  layout.block_table.assign(lengths.size() * most, -7);  // unused entries are never read
  size_t next = 0;
  for (size_t r = 0; r < lengths.size(); ++r)
    for (int64_t p = 0; p < (lengths[r] + 63) / 64; ++p)
      layout.block_table[r * most + p] = pages[next++];
  return layout;
}

// An fp8 indexer pool [num_pages * 64, 132] of random keys (unused slots too).
inline std::vector<uint8_t> random_indexer_pool(int64_t num_pages, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint8_t> pool(static_cast<size_t>(num_pages) * 64 * reference::kIndexerEntryBytes);
  std::vector<float> key(reference::kIndexerDim);
  for (int64_t slot = 0; slot < num_pages * 64; ++slot) {
    const float spread = 0.5f + static_cast<float>(rng() % 100) / 50.f;  // per-key scale varies
    for (float& v : key) v = normal(rng) * spread;
    reference::encode_indexer_key_fp8(key.data(),
                                      pool.data() + slot * reference::kIndexerEntryBytes);
  }
  return pool;
}

// An fp8 latent pool [num_slots, 656] of random entries.
inline std::vector<uint8_t> random_latent_pool(int64_t num_slots, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint8_t> pool(static_cast<size_t>(num_slots) * reference::kLatentEntryBytes);
  std::vector<float> c_kv(reference::kLatentRankDim), k_rope(reference::kLatentRopeDim);
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    for (float& v : c_kv) v = normal(rng);
    for (float& v : k_rope) v = normal(rng);
    reference::encode_latent_fp8(c_kv.data(), k_rope.data(),
                                 pool.data() + slot * reference::kLatentEntryBytes);
  }
  return pool;
}

// Random e4m3 queries (no NaN codes) and their float values.
inline void random_fp8_queries(size_t count, std::mt19937& rng, std::vector<uint8_t>& bytes,
                               std::vector<float>& values) {
  std::normal_distribution<float> normal(0.f, 100.f);
  bytes.resize(count);
  values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    bytes[i] = float_to_fp8_e4m3(normal(rng));
    values[i] = fp8_e4m3_to_float(bytes[i]);
  }
}

}  // namespace megactx::test
