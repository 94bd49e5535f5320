#include "bench/cuda/support/linear_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

LinearBenchRun::LinearBenchRun(const char* title) {
  MEGACTX_CUDA_CHECK(cudaStreamCreate(&stream));
  floor = measure_read_bandwidth(size_t{4} << 30, 5, stream);
  std::printf("%s\n\nread-only bandwidth (floor): %.0f GB/s\n\n", title, floor.read_gbs);
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS could not start\n");
    std::exit(1);
  }
  cublasSetStream(cublas, stream);
  cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH);
}

LinearBenchRun::~LinearBenchRun() {
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
}

int hbm_copies(size_t bytes) {
  return static_cast<int>(
      std::max<size_t>(2, (size_t{256} << 20) / std::max<size_t>(bytes, 1) + 1));
}

void cublas_bf16_linear(cublasHandle_t handle, int64_t rows, int64_t in, int64_t out,
                        const __nv_bfloat16* w, const __nv_bfloat16* x, float* y) {
  const float one = 1.f, zero = 0.f;
  cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows),
               static_cast<int>(in), &one, w, CUDA_R_16BF, static_cast<int>(in), x, CUDA_R_16BF,
               static_cast<int>(in), &zero, y, CUDA_R_32F, static_cast<int>(out),
               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

std::string us_or_dash(double us) {
  char buffer[32] = "-";
  if (us > 0) std::snprintf(buffer, sizeof(buffer), "%.2f", us);
  return buffer;
}

}  // namespace megactx::cuda
