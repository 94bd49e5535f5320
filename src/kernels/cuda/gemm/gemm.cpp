#include "kernels/cuda/gemm/gemm.h"

#include <cublas_v2.h>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("cuBLAS {} failed: {} ({})", what, cublasGetStatusString(status),
         static_cast<int>(status));
  }
}

int narrow(int64_t value, const char* what) {
  MEGACTX_CHECK(value >= 0 && value <= INT32_MAX, "GEMM {} = {} does not fit cuBLAS int", what,
                value);
  return static_cast<int>(value);
}

}  // namespace

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "create");
  handle_ = handle;
  check(cublasSetStream(handle, stream), "set stream");
  // Pedantic: no TF32 or reduced-precision shortcuts in the fp32 parity mode.
  check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "set math mode");
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (x_bf16_ != nullptr) cudaFree(x_bf16_);
}

void Blas::linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                  int64_t out, float* y, int64_t y_stride) {
  if (!w.bf16) {
    linear(x, rows, in, x_stride, static_cast<const float*>(w.data), out, y, y_stride);
    return;
  }
  if (rows == 0 || out == 0) return;
  const size_t bytes = static_cast<size_t>(rows * in) * 2;
  if (bytes > x_bf16_bytes_) {
    // The previous GEMM on this stream may still read the old buffer.
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (x_bf16_ != nullptr) MEGACTX_CUDA_CHECK(cudaFree(x_bf16_));
    x_bf16_ = nullptr;
    x_bf16_bytes_ = 0;
    MEGACTX_CUDA_CHECK(cudaMalloc(&x_bf16_, bytes));
    x_bf16_bytes_ = bytes;
  }
  float_to_bf16_rows(x, rows, in, x_stride, x_bf16_, stream_);
  linear_bf16(x_bf16_, rows, in, in, w.data, out, y, y_stride, /*y_f32=*/true);
}

// Row-major y = x . w^T is column-major y^T = w . x^T: w [out, in] row-major is
// the column-major [in, out] matrix with ld = in, taken transposed.
void Blas::linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
                  int64_t out, float* y, int64_t y_stride) {
  if (rows == 0 || out == 0) return;
  const float one = 1.0f, zero = 0.0f;
  check(
      cublasSgemm(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N,
                  narrow(out, "out"), narrow(rows, "rows"), narrow(in, "in"), &one, w,
                  narrow(in, "ldw"), x, narrow(x_stride, "ldx"), &zero, y, narrow(y_stride, "ldy")),
      "sgemm");
}

void Blas::linear_batched(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                          int64_t x_batch_stride, const float* w, int64_t out,
                          int64_t w_batch_stride, float* y, int64_t y_stride,
                          int64_t y_batch_stride, int64_t batch) {
  if (rows == 0 || out == 0 || batch == 0) return;
  const float one = 1.0f, zero = 0.0f;
  check(cublasSgemmStridedBatched(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N,
                                  narrow(out, "out"), narrow(rows, "rows"), narrow(in, "in"), &one,
                                  w, narrow(in, "ldw"), w_batch_stride, x, narrow(x_stride, "ldx"),
                                  x_batch_stride, &zero, y, narrow(y_stride, "ldy"), y_batch_stride,
                                  narrow(batch, "batch")),
        "sgemm batched");
}

void Blas::linear_bf16(const void* x, int64_t rows, int64_t in, int64_t x_stride, const void* w,
                       int64_t out, void* y, int64_t y_stride, bool y_f32) {
  if (rows == 0 || out == 0) return;
  auto handle = static_cast<cublasHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  // Tensor cores for bf16; the handle stays pedantic for the fp32 calls.
  check(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "set math mode");
  const cublasStatus_t status =
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, narrow(out, "out"), narrow(rows, "rows"),
                   narrow(in, "in"), &one, w, CUDA_R_16BF, narrow(in, "ldw"), x, CUDA_R_16BF,
                   narrow(x_stride, "ldx"), &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                   narrow(y_stride, "ldy"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "set math mode");
  check(status, "gemm bf16");
}

}  // namespace megactx::cuda
