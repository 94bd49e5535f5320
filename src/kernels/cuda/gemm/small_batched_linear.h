// Batched float32 linears of a few rows (the absorbed MLA products of decode:
// per head, q_nope [rows, 128..192] . W_UK [512, nope]^T and o_latent
// [rows, 512] . W_UV [v, 512]^T), for which cuBLAS's batched SGEMM launches
// latency-bound kernels (ncu on glm_1b's decode: 10-15 us per call for ~4 MB
// of weights). y_b[r, o] = sum_i x_b[r, i] * w_b[o, i] with x_b = x + b *
// x_batch_stride (row stride x_stride), w_b = w + b * w_batch_stride ([out,
// in] row-major), y_b = y + b * y_batch_stride (row stride y_stride).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

inline constexpr int64_t kSmallBatchedLinearMaxRows = 16;

// The geometry both kernels take (strides in elements).
struct BatchedLinearShape {
  int64_t rows = 0, in = 0, out = 0, batch = 0;
  int64_t x_stride = 0, x_batch_stride = 0, w_batch_stride = 0, y_stride = 0, y_batch_stride = 0;
};

struct SmallBatchedLinear : BatchedLinearShape {
  const float* x = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
};

// Launches it when it serves the shape (1..kSmallBatchedLinearMaxRows rows, in a
// multiple of 4 with 16-byte aligned weight rows, the rows' x within 48 KiB of
// shared memory); false otherwise (the caller runs cuBLAS).
bool small_batched_linear(const SmallBatchedLinear& g, cudaStream_t stream);

// The same product in bf16 on the tensor cores (small_batched_linear_bf16.cu):
// x and w bf16, float32 accumulation, y float32 (y_f32) or bf16 (rounded to
// nearest even): the absorbed W_UK / W_UV of the bf16 decode, whose cuBLAS
// batched GEMM took 6.8 / 8.0 us per layer at 16 rows for 12.6 / 16.8 MB of
// weights (2.9 / 3.8 us at the read rate; GLM-5.2 attention config, ncu).
// Opt-in through Blas::linear_batched_bf16 (MEGACTX_SMALL_BATCHED_BF16_ROWS):
// its first version was slower than cuBLAS in the model.
inline constexpr int64_t kSmallBatchedLinearBf16MaxRows = 64;

struct SmallBatchedLinearBf16 : BatchedLinearShape {
  const void* x = nullptr;  // bf16
  const void* w = nullptr;  // bf16
  void* y = nullptr;        // float32 or bf16
  bool y_f32 = true;
};

// Launches it when it serves the shape: 1..kSmallBatchedLinearBf16MaxRows rows,
// `in` a multiple of 32 up to 1024, `out` a multiple of 16, x and w rows in
// whole 16-byte chunks (pointers 16-byte aligned, strides multiples of 8),
// y's pairs aligned (even strides); false otherwise (the caller runs cuBLAS).
bool small_batched_linear_bf16(const SmallBatchedLinearBf16& g, cudaStream_t stream);

}  // namespace megactx::cuda
