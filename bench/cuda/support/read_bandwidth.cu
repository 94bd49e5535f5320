#include "bench/cuda/support/read_bandwidth.h"

#include <cstdint>
#include <stdexcept>

#include "bench/cuda/support/stream_timing.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 512;

// Each thread sums the words of its 16-byte vectors; one sum per block.
__global__ void read_reduce(const uint4* __restrict__ data, size_t vectors,
                            uint32_t* __restrict__ block_sums) {
  uint32_t sum = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += stride) {
    const uint4 v = __ldcs(data + i);  // streaming: no reuse, do not keep in L2
    sum += v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ uint32_t warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    block_sums[blockIdx.x] = total;
  }
}

// A warp per group of kGatherEntries entries: lane l loads 16-byte chunks l,
// l + 32, ... of each, every load of the group issued before any is used.
constexpr int kGatherEntries = 4;
constexpr int kGatherChunks = 2;  // per lane and entry: entries up to 64 x 16 bytes

__global__ void gather_reduce(const uint8_t* __restrict__ pool, int chunks_per_entry,
                              size_t entry_bytes, const int32_t* __restrict__ slots, size_t count,
                              uint32_t* __restrict__ block_sums) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / 32;
  uint32_t sum = 0;
  for (size_t first = warp * kGatherEntries; first < count; first += warps * kGatherEntries) {
    uint4 v[kGatherEntries][kGatherChunks];
#pragma unroll
    for (int e = 0; e < kGatherEntries; ++e) {
      const int32_t slot = first + e < count ? slots[first + e] : -1;
      const uint4* entry = reinterpret_cast<const uint4*>(
          pool + static_cast<size_t>(slot < 0 ? 0 : slot) * entry_bytes);
#pragma unroll
      for (int c = 0; c < kGatherChunks; ++c) {
        const int chunk = lane + 32 * c;
        v[e][c] =
            slot >= 0 && chunk < chunks_per_entry ? __ldg(entry + chunk) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int e = 0; e < kGatherEntries; ++e)
#pragma unroll
      for (int c = 0; c < kGatherChunks; ++c) sum += v[e][c].x ^ v[e][c].y ^ v[e][c].z ^ v[e][c].w;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ uint32_t warp_sums[kThreads / 32];
  if (lane == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    block_sums[blockIdx.x] = total;
  }
}

}  // namespace

double measure_gather_read_ms(const void* pool, size_t entry_bytes, const int32_t* slots,
                              size_t count, int runs, cudaStream_t stream) {
  const int chunks = static_cast<int>(entry_bytes / 16);
  if (entry_bytes % 16 != 0 || chunks > 32 * kGatherChunks)
    throw std::invalid_argument("measure_gather_read_ms: entries of 16-byte multiples up to 1 KiB");
  int device = 0, sms = 0;
  MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
  MEGACTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int blocks = sms * 4;
  uint32_t* sums = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&sums, sizeof(uint32_t) * blocks));
  const double ms = stream_median_ms(
      stream,
      [&] {
        gather_reduce<<<blocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(pool), chunks,
                                                       entry_bytes, slots, count, sums);
        MEGACTX_CUDA_CHECK(cudaGetLastError());
      },
      runs);
  MEGACTX_CUDA_CHECK(cudaFree(sums));
  return ms;
}

ReadBandwidth measure_read_bandwidth(size_t bytes, int runs, cudaStream_t stream) {
  ReadBandwidth result;
  const size_t vectors = bytes / sizeof(uint4);
  result.bytes = vectors * sizeof(uint4);
  int device = 0, sms = 0;
  MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
  MEGACTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int blocks = sms * 4;  // 4 x 512 threads per SM: enough loads in flight
  uint4* data = nullptr;
  uint32_t* sums = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&data, result.bytes));
  MEGACTX_CUDA_CHECK(cudaMalloc(&sums, sizeof(uint32_t) * blocks));
  MEGACTX_CUDA_CHECK(cudaMemsetAsync(data, 1, result.bytes, stream));
  const double read_ms = stream_median_ms(
      stream,
      [&] {
        read_reduce<<<blocks, kThreads, 0, stream>>>(data, vectors, sums);
        MEGACTX_CUDA_CHECK(cudaGetLastError());
      },
      runs);
  result.read_gbs = static_cast<double>(result.bytes) / (read_ms * 1e-3) / 1e9;
  const size_t half = result.bytes / 2;
  const double copy_ms = stream_median_ms(
      stream,
      [&] {
        MEGACTX_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t*>(data) + half, data, half,
                                           cudaMemcpyDeviceToDevice, stream));
      },
      runs);
  result.copy_gbs = 2.0 * static_cast<double>(half) / (copy_ms * 1e-3) / 1e9;
  MEGACTX_CUDA_CHECK(cudaFree(sums));
  MEGACTX_CUDA_CHECK(cudaFree(data));
  return result;
}

}  // namespace megactx::cuda
