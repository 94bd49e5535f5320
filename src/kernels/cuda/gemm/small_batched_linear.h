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

struct SmallBatchedLinear {
  const float* x = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
  int64_t rows = 0, in = 0, out = 0, batch = 0;
  int64_t x_stride = 0, x_batch_stride = 0, w_batch_stride = 0, y_stride = 0, y_batch_stride = 0;
};

// Launches it when it serves the shape (1..kSmallBatchedLinearMaxRows rows, in a
// multiple of 4 with 16-byte aligned weight rows, the rows' x within 48 KiB of
// shared memory); false otherwise (the caller runs cuBLAS).
bool small_batched_linear(const SmallBatchedLinear& g, cudaStream_t stream);

}  // namespace megactx::cuda
