// Row-wise arithmetic shared by the element-wise kernels
// (kernels/cuda/elementwise) and the fused latent write of the fallback DSA path
// (kernels/cuda/dsa_fallback), written once so that the fused kernel and the
// separate ones give the same bits. Only for .cu files.
#pragma once

#include <cstdint>

namespace megactx::cuda {

// Sum of `value` over a block of kThreads threads; every thread gets the total
// (warp shuffles, then the warps' sums in warp order). `shared`: kThreads / 32
// floats.
template <int kThreads>
__device__ __forceinline__ float block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  __syncthreads();
  return total;
}

// torch.nn.LayerNorm of one row (biased variance) by a block of kThreads
// threads: y[i] = (x[i] - mean) * inv * weight[i] + bias[i]; x and y may
// alias. The layernorm kernel and the fused indexer-key write both call it,
// so they round alike. `shared`: kThreads / 32 floats.
template <int kThreads>
__device__ __forceinline__ void layernorm_row(const float* x, int64_t n, const float* weight,
                                              const float* bias, float eps, float* y,
                                              float* shared) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += x[i];
  const float mean = block_sum<kThreads>(sum, shared) / static_cast<float>(n);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) var += (x[i] - mean) * (x[i] - mean);
  const float inv = rsqrtf(block_sum<kThreads>(var, shared) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    y[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

// One rotary pair (x1, x2) turned by (cos, sin) = (c, s), with the rounding
// fixed: x1 c - x2 s and x2 c + x1 s.
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
  return __fmaf_rn(x1, c, -__fmul_rn(x2, s));
}
__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
  return __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

}  // namespace megactx::cuda
