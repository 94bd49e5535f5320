// Fast CPU dense operations: OpenBLAS sgemm for the GEMMs, the global
// ThreadPool for row-parallel elementwise work. Same contracts as
// kernels/reference/dense_ops.h (tested against it).
#pragma once

#include <cstdint>

namespace megactx::cpu {

// y[rows, out] = x[rows, in] . w[out, in]^T
void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y);
// Same with explicit leading dimensions (row strides) of x and y.
void linear_strided(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
                    int64_t out, float* y, int64_t y_stride);

void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
             float eps, float* y, int64_t y_stride);
void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
               float eps, float* y);
void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
              float* out);
void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
          int64_t dim, const float* cos, const float* sin, bool interleaved);

// The machine's measured sgemm rate (GFLOP/s) on square n x n x n products.
double measure_sgemm_gflops(int64_t n, int repeats);

}  // namespace megactx::cpu
