#include "kernels/reference/dense_ops.h"

#include <cmath>

namespace megactx::reference {

void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    for (int64_t o = 0; o < out; ++o) {
      const float* wo = w + o * in;
      double sum = 0.0;
      for (int64_t i = 0; i < in; ++i) sum += static_cast<double>(xr[i]) * wo[i];
      y[r * out + o] = static_cast<float>(sum);
    }
  }
}

void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
             float eps, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
    float* yr = y + r * y_stride;
    for (int64_t i = 0; i < n; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
               float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double mean = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += xr[i];
    mean /= static_cast<double>(n);
    double var = 0.0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(n);  // biased, as torch.nn.LayerNorm
    const double inv = 1.0 / std::sqrt(var + eps);
    float* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) {
      yr[i] = static_cast<float>((xr[i] - mean) * inv) * weight[i] + bias[i];
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
              float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[r * stride + i];
      out[r * n + i] = g / (1.0f + std::exp(-g)) * up[r * stride + i];
    }
  }
}

void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
          int64_t dim, const float* cos, const float* sin, bool interleaved) {
  const int64_t half = dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + h * head_stride;
      for (int64_t i = 0; i < half; ++i) {
        float* a = interleaved ? v + 2 * i : v + i;
        float* b = interleaved ? v + 2 * i + 1 : v + i + half;
        const float x1 = *a;
        const float x2 = *b;
        *a = x1 * c[i] - x2 * s[i];
        *b = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

}  // namespace megactx::reference
