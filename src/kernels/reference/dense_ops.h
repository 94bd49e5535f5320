// Reference dense operations: plain fp32 loops, the oracle every faster kernel
// (CPU BLAS, CUDA) is tested against. Row-major, contiguous unless a stride is given.
#pragma once

#include <cstdint>

namespace megactx::reference {

// y[rows, out] = x[rows, in] . w[out, in]^T (a torch Linear without bias).
void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y);

// RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * weight.
// x: [rows, n] with row stride x_stride; y: [rows, n] with row stride y_stride.
void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
             float eps, float* y, int64_t y_stride);

// LayerNorm with affine weight and bias: x, y [rows, n] contiguous.
void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
               float eps, float* y);

// out[rows, n] = silu(gate) * up, with gate/up rows of stride `stride`.
void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
              float* out);

// Rotary embedding in place on x[rows, heads, ...]: the `dim` values of head h
// of row r start at x + r * row_stride + h * head_stride. cos/sin: [rows, dim/2].
// interleaved: pairs (x[2i], x[2i+1]) rotate by angle i, results stay in place.
// half-split: pairs (x[i], x[i + dim/2]) rotate by angle i.
void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
          int64_t dim, const float* cos, const float* sin, bool interleaved);

}  // namespace megactx::reference
