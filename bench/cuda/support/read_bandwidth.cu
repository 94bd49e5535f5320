#include "bench/cuda/support/read_bandwidth.h"

#include <cstdint>

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

}  // namespace

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
