// cuBLAS GEMMs of the CUDA model, in the CPU Backend's row-major convention:
// y[rows, out] (row stride y_stride) = x[rows, in] (row stride x_stride) . w[out, in]^T.
// fp32 runs cublasSgemm with TF32 off (the exact-parity mode); bf16 runs
// cublasGemmEx on tensor cores with fp32 accumulation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// A weight matrix w [out, in] (row-major) on the device: float32 (the parity
// mode) or bf16 (the fast mode).
struct DeviceMatrix {
  const void* data = nullptr;
  bool bf16 = false;
  explicit operator bool() const { return data != nullptr; }
};

// x [rows, n] float32 (row stride x_stride) -> y [rows, n] bf16 (dense).
void float_to_bf16_rows(const float* x, int64_t rows, int64_t n, int64_t x_stride, void* y,
                        cudaStream_t stream);

class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
              int64_t out, float* y, int64_t y_stride);
  void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y) {
    linear(x, rows, in, in, w, out, y, out);
  }
  // y = x . w^T with a float32 or bf16 weight: bf16 weights round x to bf16
  // (a grow-only scratch of this Blas) and accumulate in float32.
  void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
              int64_t out, float* y, int64_t y_stride);
  void linear(const float* x, int64_t rows, int64_t in, DeviceMatrix w, int64_t out, float* y) {
    linear(x, rows, in, in, w, out, y, out);
  }
  // `batch` independent linears: x_b = x + b * x_batch_stride, w_b = w + b *
  // w_batch_stride, y_b = y + b * y_batch_stride (per-head MLA absorption).
  void linear_batched(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                      int64_t x_batch_stride, const float* w, int64_t out, int64_t w_batch_stride,
                      float* y, int64_t y_stride, int64_t y_batch_stride, int64_t batch);
  // bf16 x [rows, in] . bf16 w [out, in]^T -> y (bf16, or float32 when y_f32).
  void linear_bf16(const void* x, int64_t rows, int64_t in, int64_t x_stride, const void* w,
                   int64_t out, void* y, int64_t y_stride, bool y_f32);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
  cudaStream_t stream_ = nullptr;
  void* x_bf16_ = nullptr;  // [rows, in] bf16 inputs of the last bf16 linear
  size_t x_bf16_bytes_ = 0;
};

}  // namespace megactx::cuda
