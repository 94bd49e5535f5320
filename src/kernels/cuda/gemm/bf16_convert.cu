// float32 -> bf16 rows for the bf16 GEMM path of Blas (gemm.h).
#include <cuda_bf16.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/gemm.h"

namespace megactx::cuda {
namespace {

__global__ void float_to_bf16_kernel(const float* x, int64_t rows, int64_t n, int64_t x_stride,
                                     __nv_bfloat16* y) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    y[i] = __float2bfloat16_rn(x[r * x_stride + c]);
  }
}

}  // namespace

void float_to_bf16_rows(const float* x, int64_t rows, int64_t n, int64_t x_stride, void* y,
                        cudaStream_t stream) {
  const int64_t total = rows * n;
  if (total == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  launch_kernel(float_to_bf16_kernel, static_cast<unsigned>(blocks < 4096 ? blocks : 4096),
                kThreads, 0, stream, x, rows, n, x_stride, static_cast<__nv_bfloat16*>(y));
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
