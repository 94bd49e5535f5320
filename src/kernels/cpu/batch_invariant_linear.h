// A batch-invariant y = x . w^T for the deterministic mode: every output
// element is one dot product with a fixed summation order (8 interleaved
// partial sums over k, combined in a fixed tree, then the tail in order), so
// a row's result is bit-identical whatever rows share the call: a decode
// step's 1 row, a prefill chunk's hundreds, an MTP verification's k + 1.
// OpenBLAS is not: it switches between gemv, small-matrix and packed gemm
// kernels by shape, with different summation orders.
#pragma once

#include <cstdint>

namespace megactx::cpu {

// y[rows, out] (row stride y_stride) = x[rows, in] (row stride x_stride) . w[out, in]^T
void linear_batch_invariant(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                            const float* w, int64_t out, float* y, int64_t y_stride);

// The dot product every element of linear_batch_invariant is (tests).
float batch_invariant_dot(const float* a, const float* b, int64_t n);

}  // namespace megactx::cpu
