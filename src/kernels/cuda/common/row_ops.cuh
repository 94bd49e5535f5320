// Row-wise arithmetic shared by the element-wise kernels
// (kernels/cuda/elementwise) and the fused latent write of the fallback DSA path
// (kernels/cuda/dsa_fallback), written once so that the fused kernel and the
// separate ones give the same bits. Only for .cu files.
#pragma once

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

// One rotary pair (x1, x2) turned by (cos, sin) = (c, s), with the rounding
// fixed: x1 c - x2 s and x2 c + x1 s.
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
  return __fmaf_rn(x1, c, -__fmul_rn(x2, s));
}
__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
  return __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

}  // namespace megactx::cuda
