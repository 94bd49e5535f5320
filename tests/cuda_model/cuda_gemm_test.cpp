// The CUDA model's GEMMs against host double-precision loops: cuBLAS fp32
// (plain, strided, per-head batched), bf16 with fp32 accumulation, and the
// fp8 e4m3 128x128 block-scaled weights dequantized on the fly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/gemm/gemm.h"

namespace megactx::cuda {
namespace {

template <typename T>
T* to_device(const std::vector<T>& values) {
  T* data = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(values.size(), 1) * sizeof(T)));
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(data, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  return data;
}

template <typename T>
std::vector<T> to_host(const T* data, size_t count) {
  std::vector<T> values(count);
  MEGACTX_CUDA_CHECK(cudaMemcpy(values.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost));
  return values;
}

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}

// y[r, o] = sum_i x[r, i] * w[o, i], in double.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                              int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t i = 0; i < in; ++i) sum += static_cast<double>(x[r * in + i]) * w[o * in + i];
      y[r * out + o] = sum;
    }
  return y;
}

double max_relative(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / scale;
}

TEST(CudaGemm, Fp32LinearAndBatchedMatchDoubleLoops) {
  const int64_t rows = 37, in = 300, out = 129, heads = 3;
  const auto x = random_values(static_cast<size_t>(rows * in), 1);
  const auto w = random_values(static_cast<size_t>(out * in), 2);
  float* dx = to_device(x);
  float* dw = to_device(w);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out * heads) * sizeof(float)));
  Blas blas(nullptr);
  blas.linear(dx, rows, in, dw, out, dy);
  EXPECT_LE(
      max_relative(to_host(dy, static_cast<size_t>(rows * out)), reference(x, w, rows, in, out)),
      1e-5);
  // Per head h: x columns [h * 100, h * 100 + 100) against w rows [h * 43, h * 43 + 43)
  // ([43, 100] each), into y columns [h * 43, ...) of a [rows, 129] output.
  const int64_t sub_in = 100, sub_out = 43;
  blas.linear_batched(dx, rows, sub_in, in, sub_in, dw, sub_out, sub_out * sub_in, dy, out, sub_out,
                      heads);
  const auto got = to_host(dy, static_cast<size_t>(rows * out));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < sub_out; ++o) {
        double sum = 0.0;
        for (int64_t i = 0; i < sub_in; ++i)
          sum += static_cast<double>(x[r * in + h * sub_in + i]) *
                 w[h * sub_out * sub_in + o * sub_in + i];
        EXPECT_NEAR(got[r * out + h * sub_out + o], sum, 1e-4) << h << " " << r << " " << o;
      }
    }
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

TEST(CudaGemm, Bf16LinearMatchesRoundedInputs) {
  const int64_t rows = 20, in = 256, out = 96;
  auto x = random_values(static_cast<size_t>(rows * in), 3);
  auto w = random_values(static_cast<size_t>(out * in), 4);
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i] = float_to_bf16(x[i]));
  for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_float(wb[i] = float_to_bf16(w[i]));
  uint16_t* dx = to_device(xb);
  uint16_t* dw = to_device(wb);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out) * sizeof(float)));
  Blas blas(nullptr);
  blas.linear_bf16(dx, rows, in, in, dw, out, dy, out, true);
  // Exact products of bf16 inputs, fp32 accumulation.
  EXPECT_LE(
      max_relative(to_host(dy, static_cast<size_t>(rows * out)), reference(x, w, rows, in, out)),
      1e-5);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

TEST(CudaGemm, Fp8BlockScaledWeightsMatchDequantizedReference) {
  // Shapes that are not multiples of the tiles or of the 128 scale blocks.
  const int64_t rows = 70, in = 300, out = 200;
  const int64_t scale_rows = (out + 127) / 128, scale_cols = (in + 127) / 128;
  const auto x = random_values(static_cast<size_t>(rows * in), 5);
  std::mt19937 rng(6);
  std::vector<uint8_t> wq(static_cast<size_t>(out * in));
  for (uint8_t& b : wq) {
    do b = static_cast<uint8_t>(rng() & 0xff);
    while ((b & 0x7f) == 0x7f);  // not NaN
  }
  auto scale = random_values(static_cast<size_t>(scale_rows * scale_cols), 7);
  for (float& s : scale) s = std::fabs(s) * 1e-2f + 1e-3f;
  std::vector<float> w(wq.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      w[o * in + i] = fp8_e4m3_to_float(wq[o * in + i]) * scale[(o / 128) * scale_cols + i / 128];
  float* dx = to_device(x);
  uint8_t* dw = to_device(wq);
  float* ds = to_device(scale);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out) * sizeof(float)));
  Fp8BlockGemm g;
  g.x = dx;
  g.x_stride = in;
  g.w = dw;
  g.scale = ds;
  g.y = dy;
  g.y_stride = out;
  g.rows = rows;
  g.in = in;
  g.out = out;
  fp8_block_gemm(g, nullptr);
  EXPECT_LE(
      max_relative(to_host(dy, static_cast<size_t>(rows * out)), reference(x, w, rows, in, out)),
      1e-5);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(ds);
  cudaFree(dy);
}

}  // namespace
}  // namespace megactx::cuda
