// The few-row batched linear of small_batched_linear.h: a block per (batch, 64
// outputs); the block's x rows [rows, in] staged in shared memory once, each
// warp takes 8 outputs and walks their weight rows with float4 loads (lanes
// over `in`), every lane keeping a partial sum per row, reduced across the warp
// at the end. Bandwidth on the weights, one launch for every head.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/small_batched_linear.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kOutputsPerWarp = 8;
constexpr int kOutputsPerBlock = kWarps * kOutputsPerWarp;  // 64
constexpr int64_t kMaxSharedFloats = 12288;                 // 48 KiB of staged x: rows x in

template <int kRows>
__global__ void __launch_bounds__(kThreads) small_batched_linear_kernel(SmallBatchedLinear g) {
  extern __shared__ float4 staged[];
  float* xs = reinterpret_cast<float*>(staged);  // [kRows, in]; rows past g.rows are 0
  const int64_t b = blockIdx.y;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kOutputsPerBlock;
  const float* x = g.x + b * g.x_batch_stride;
  for (int64_t i = threadIdx.x; i < kRows * g.in; i += kThreads) {
    const int64_t r = i / g.in, c = i % g.in;
    xs[r * g.in + c] = r < g.rows ? x[r * g.x_stride + c] : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t quads = g.in / 4;
  for (int k = 0; k < kOutputsPerWarp; ++k) {
    const int64_t o = o0 + warp * kOutputsPerWarp + k;
    if (o >= g.out) break;
    const float4* w = reinterpret_cast<const float4*>(g.w + b * g.w_batch_stride + o * g.in);
    float sum[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) sum[r] = 0.0f;
    for (int64_t q = lane; q < quads; q += 32) {
      const float4 wv = w[q];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 xv = *reinterpret_cast<const float4*>(&xs[r * g.in + 4 * q]);
        sum[r] = __fmaf_rn(wv.x, xv.x, sum[r]);
        sum[r] = __fmaf_rn(wv.y, xv.y, sum[r]);
        sum[r] = __fmaf_rn(wv.z, xv.z, sum[r]);
        sum[r] = __fmaf_rn(wv.w, xv.w, sum[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float value = sum[r];
      for (int offset = 16; offset > 0; offset /= 2)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
      if (lane == 0 && r < g.rows) g.y[b * g.y_batch_stride + r * g.y_stride + o] = value;
    }
  }
}

template <int kRows>
bool launch(const SmallBatchedLinear& g, cudaStream_t stream) {
  if (kRows * g.in > kMaxSharedFloats) return false;
  const dim3 grid(static_cast<unsigned>((g.out + kOutputsPerBlock - 1) / kOutputsPerBlock),
                  static_cast<unsigned>(g.batch));
  const size_t shared = static_cast<size_t>(kRows * g.in) * sizeof(float);
  small_batched_linear_kernel<kRows><<<grid, kThreads, shared, stream>>>(g);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace

bool small_batched_linear(const SmallBatchedLinear& g, cudaStream_t stream) {
  if (g.rows < 1 || g.rows > kSmallBatchedLinearMaxRows || g.in < 4 || g.in % 4 != 0 || g.out < 1 ||
      g.batch < 1 || g.batch > 65535)
    return false;
  if ((reinterpret_cast<uintptr_t>(g.w) & 15u) != 0 || g.w_batch_stride % 4 != 0) return false;
  // Rows rounded up to 1, 2, 4, 8, 16 (the kernel stores only the real ones).
  if (g.rows <= 1) return launch<1>(g, stream);
  if (g.rows <= 2) return launch<2>(g, stream);
  if (g.rows <= 4) return launch<4>(g, stream);
  if (g.rows <= 8) return launch<8>(g, stream);
  return launch<16>(g, stream);
}

}  // namespace megactx::cuda
