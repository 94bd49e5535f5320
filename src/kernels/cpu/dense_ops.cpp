#include "kernels/cpu/dense_ops.h"

#include <cblas.h>

#include <chrono>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/reference/dense_ops.h"

namespace megactx::cpu {

void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y) {
  linear_strided(x, rows, in, in, w, out, y, out);
}

void linear_strided(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
                    int64_t out, float* y, int64_t y_stride) {
  if (rows == 0 || out == 0) return;
  if (in == 0) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * y_stride + o] = 0.0f;
    return;
  }
  if (rows == 1) {
    // Decode: a matrix-vector product streams the weights once; sgemm would
    // first pack (copy) them.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
                static_cast<int>(in), x, 1, 0.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
              static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(x_stride), w,
              static_cast<int>(in), 0.0f, y, static_cast<int>(y_stride));
}

// Row-parallel wrappers: rows are independent, so each chunk calls the
// reference loop on its own rows (these ops are memory bound and tiny next to
// the GEMMs; the reference loops vectorize well enough).
void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
             float eps, float* y, int64_t y_stride) {
  ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end) {
    reference::rmsnorm(x + begin * x_stride, end - begin, n, x_stride, weight, eps,
                       y + begin * y_stride, y_stride);
  });
}

void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
               float eps, float* y) {
  ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end) {
    reference::layernorm(x + begin * n, end - begin, n, weight, bias, eps, y + begin * n);
  });
}

void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
              float* out) {
  ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end) {
    reference::silu_mul(gate + begin * stride, up + begin * stride, end - begin, n, stride,
                        out + begin * n);
  });
}

void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
          int64_t dim, const float* cos, const float* sin, bool interleaved) {
  reference::rope(x, rows, heads, row_stride, head_stride, dim, cos, sin, interleaved);
}

double measure_sgemm_gflops(int64_t n, int repeats) {
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  linear(a.data(), n, n, b.data(), n, c.data());  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) linear(a.data(), n, n, b.data(), n, c.data());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * static_cast<double>(n) * n * n * repeats / seconds / 1e9;
}

}  // namespace megactx::cpu
