#include "bench/cuda/support/gemm_ceiling.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/cuda/support/synthetic_cache.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

double measure_bf16_gemm_tflops(int runs, cudaStream_t stream) {
  constexpr int n = 8192;
  const size_t bytes = size_t{n} * n * sizeof(uint16_t);
  uint16_t *x = nullptr, *y = nullptr, *z = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&x, bytes));
  MEGACTX_CUDA_CHECK(cudaMalloc(&y, bytes));
  MEGACTX_CUDA_CHECK(cudaMalloc(&z, bytes));
  fill_random_bf16(x, int64_t{n} * n, 1.f, 1, stream);
  fill_random_bf16(y, int64_t{n} * n, 1.f, 2, stream);
  std::vector<float> times;
  cublasHandle_t handle;
  if (cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
    cublasSetStream(handle, stream);
    cudaEvent_t start, stop;
    MEGACTX_CUDA_CHECK(cudaEventCreate(&start));
    MEGACTX_CUDA_CHECK(cudaEventCreate(&stop));
    const float one = 1.f, zero = 0.f;
    for (int run = 0; run <= runs; ++run) {  // run 0 warms up
      MEGACTX_CUDA_CHECK(cudaEventRecord(start, stream));
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, x, CUDA_R_16BF, n, y,
                   CUDA_R_16BF, n, &zero, z, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
      MEGACTX_CUDA_CHECK(cudaEventRecord(stop, stream));
      MEGACTX_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      MEGACTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (run > 0) times.push_back(ms);
    }
    MEGACTX_CUDA_CHECK(cudaEventDestroy(start));
    MEGACTX_CUDA_CHECK(cudaEventDestroy(stop));
    cublasDestroy(handle);
  }
  MEGACTX_CUDA_CHECK(cudaFree(x));
  MEGACTX_CUDA_CHECK(cudaFree(y));
  MEGACTX_CUDA_CHECK(cudaFree(z));
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  const double median_ms = times[times.size() / 2];
  return 2.0 * n * n * double(n) / (median_ms * 1e-3) / 1e12;
}

}  // namespace megactx::cuda
