#include "bench/cuda/support/synthetic_cache.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {
namespace {

__device__ __forceinline__ float unit(uint32_t bits) {
  return (bits >> 8) * (1.f / 16777216.f);
}  // [0, 1)
__device__ __forceinline__ uint32_t no_nan_bytes(uint32_t word) {
  // e4m3 NaN is s1111111: flip the low bit of any such byte.
  for (int b = 0; b < 4; ++b)
    if (((word >> (8 * b)) & 0x7fu) == 0x7fu) word ^= 1u << (8 * b);
  return word;
}

// One thread per 4-byte word of an entry; entries are word-aligned (132, 656).
__global__ void fill_pool_kernel(uint8_t* pool, int64_t num_slots, int entry_bytes, int fp8_bytes,
                                 int scales, uint32_t seed) {
  const int64_t words_per_entry = entry_bytes / 4;
  const int64_t total = num_slots * words_per_entry;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t offset = (i % words_per_entry) * 4;
    uint32_t bits = hash_mix((static_cast<uint64_t>(seed) << 40) ^ static_cast<uint64_t>(i));
    uint32_t word;
    if (offset < fp8_bytes) {
      word = no_nan_bytes(bits);
    } else if (offset < fp8_bytes + 4 * scales) {
      word = __float_as_uint(1e-3f + 9e-3f * unit(bits));
    } else {  // bf16 pair in [-1, 1]
      const float a = 2.f * unit(bits) - 1.f, b = 2.f * unit(bits * 2654435761u) - 1.f;
      word = (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
    }
    *reinterpret_cast<uint32_t*>(pool + (i / words_per_entry) * entry_bytes + offset) = word;
  }
}

__global__ void fill_bf16_kernel(uint16_t* values, int64_t count, float amplitude, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v =
        amplitude * (2.f * unit(hash_mix((static_cast<uint64_t>(seed) << 40) ^ i)) - 1.f);
    values[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
}

__global__ void fill_fp8_kernel(uint8_t* values, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    values[i] = static_cast<uint8_t>(
        no_nan_bytes(hash_mix((static_cast<uint64_t>(seed) << 40) ^ i) & 0xffu));
}

__global__ void fill_f32_kernel(float* values, int64_t count, float low, float high,
                                uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    values[i] = low + (high - low) * unit(hash_mix((static_cast<uint64_t>(seed) << 40) ^ i));
}

__global__ void fill_slots_kernel(int32_t* slots, int64_t count, int64_t num_slots, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r =
        (static_cast<uint64_t>(hash_mix((static_cast<uint64_t>(seed) << 40) ^ i)) << 32) |
        hash_mix((static_cast<uint64_t>(seed + 1) << 40) ^ i);
    slots[i] = static_cast<int32_t>(r % static_cast<uint64_t>(num_slots));
  }
}

constexpr unsigned kBlocks = 4096, kThreads = 256;

}  // namespace

void fill_synthetic_indexer_pool(uint8_t* pool, int64_t num_slots, uint32_t seed,
                                 cudaStream_t stream) {
  fill_pool_kernel<<<kBlocks, kThreads, 0, stream>>>(pool, num_slots, kIndexerKeyBytes,
                                                     kIndexerHeadDim, 1, seed);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}
void fill_synthetic_latent_pool(uint8_t* pool, int64_t num_slots, uint32_t seed,
                                cudaStream_t stream) {
  fill_pool_kernel<<<kBlocks, kThreads, 0, stream>>>(pool, num_slots, kLatentBytes, kLatentRank,
                                                     kLatentRank / kLatentGroup, seed);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}
void fill_random_bf16(uint16_t* values, int64_t count, float amplitude, uint32_t seed,
                      cudaStream_t stream) {
  fill_bf16_kernel<<<kBlocks, kThreads, 0, stream>>>(values, count, amplitude, seed);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}
void fill_random_fp8(uint8_t* values, int64_t count, uint32_t seed, cudaStream_t stream) {
  fill_fp8_kernel<<<kBlocks, kThreads, 0, stream>>>(values, count, seed);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}
void fill_random_f32(float* values, int64_t count, float low, float high, uint32_t seed,
                     cudaStream_t stream) {
  fill_f32_kernel<<<kBlocks, kThreads, 0, stream>>>(values, count, low, high, seed);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}
void fill_random_slots(int32_t* slots, int64_t count, int64_t num_slots, uint32_t seed,
                       cudaStream_t stream) {
  fill_slots_kernel<<<kBlocks, kThreads, 0, stream>>>(slots, count, num_slots, seed);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
