// batch_invariant_gemm (batch_invariant_gemm.h): a shared-memory tiled GEMM
// on CUDA cores whose per-element arithmetic is the in-order fma chain.
#include <cuda_bf16.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/batch_invariant_gemm.h"

namespace megactx::cuda {
namespace {

constexpr int kTileRows = 32;     // x rows per block
constexpr int kTileOut = 64;      // outputs per block
constexpr int kTileK = 32;        // k per shared-memory stage
constexpr int kThreads = 256;     // 16 x 16: each thread 2 rows x 4 outputs

template <typename T>
__device__ float load(const T* p, bool round_to_bf16);
template <>
__device__ float load<float>(const float* p, bool round_to_bf16) {
  return round_to_bf16 ? __bfloat162float(__float2bfloat16_rn(*p)) : *p;
}
template <>
__device__ float load<__nv_bfloat16>(const __nv_bfloat16* p, bool) {
  return __bfloat162float(*p);
}

template <typename T>
__device__ void store(T* p, float v);
template <>
__device__ void store<float>(float* p, float v) {
  *p = v;
}
template <>
__device__ void store<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

template <typename X, typename W, typename Y>
__global__ void __launch_bounds__(kThreads)
    invariant_gemm_kernel(const X* __restrict__ x, const W* __restrict__ w, Y* __restrict__ y,
                          InvariantGemm g) {
  // Transposed tiles ([k][row], [k][out]): the inner loop reads a row of each,
  // consecutive threads consecutive outputs (no bank conflicts).
  __shared__ float xs[kTileK][kTileRows + 1];
  __shared__ float ws[kTileK][kTileOut + 1];
  const int64_t b = blockIdx.z;
  x += b * g.x_batch_stride;
  w += b * g.w_batch_stride;
  y += b * g.y_batch_stride;
  const int64_t row0 = int64_t{blockIdx.y} * kTileRows, out0 = int64_t{blockIdx.x} * kTileOut;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[2][4] = {};
  for (int64_t k0 = 0; k0 < g.in; k0 += kTileK) {
    for (int e = threadIdx.x; e < kTileRows * kTileK; e += kThreads) {
      const int r = e / kTileK, k = e % kTileK;
      const int64_t gr = row0 + r, gk = k0 + k;
      xs[k][r] = gr < g.rows && gk < g.in ? load(x + gr * g.x_stride + gk, g.round_x_to_bf16)
                                          : 0.0f;
    }
    for (int e = threadIdx.x; e < kTileOut * kTileK; e += kThreads) {
      const int n = e / kTileK, k = e % kTileK;
      const int64_t gn = out0 + n, gk = k0 + k;
      ws[k][n] = gn < g.out && gk < g.in ? load(w + gn * g.in + gk, false) : 0.0f;
    }
    __syncthreads();
    // k past `in` multiplies zeros: the same for every call of this shape.
#pragma unroll 8
    for (int k = 0; k < kTileK; ++k) {
      const float a0 = xs[k][ty], a1 = xs[k][ty + 16];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float wv = ws[k][tx + 16 * j];
        acc[0][j] = __fmaf_rn(a0, wv, acc[0][j]);
        acc[1][j] = __fmaf_rn(a1, wv, acc[1][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = row0 + ty + 16 * i;
    if (r >= g.rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = out0 + tx + 16 * j;
      if (n < g.out) store(y + r * g.y_stride + n, acc[i][j]);
    }
  }
}

template <typename X, typename W, typename Y>
void launch(const InvariantGemm& g, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((g.out + kTileOut - 1) / kTileOut),
                  static_cast<unsigned>((g.rows + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>(g.batch));
  invariant_gemm_kernel<X, W, Y><<<grid, kThreads, 0, stream>>>(
      static_cast<const X*>(g.x), static_cast<const W*>(g.w), static_cast<Y*>(g.y), g);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

template <typename X, typename W>
void launch_y(const InvariantGemm& g, cudaStream_t stream) {
  if (g.y_type == GemmElement::F32) {
    launch<X, W, float>(g, stream);
  } else {
    launch<X, W, __nv_bfloat16>(g, stream);
  }
}

template <typename X>
void launch_w(const InvariantGemm& g, cudaStream_t stream) {
  if (g.w_type == GemmElement::F32) {
    launch_y<X, float>(g, stream);
  } else {
    launch_y<X, __nv_bfloat16>(g, stream);
  }
}

}  // namespace

void batch_invariant_gemm(const InvariantGemm& g, cudaStream_t stream) {
  if (g.rows == 0 || g.out == 0 || g.batch == 0) return;
  if (g.x_type == GemmElement::F32) {
    launch_w<float>(g, stream);
  } else {
    launch_w<__nv_bfloat16>(g, stream);
  }
}

}  // namespace megactx::cuda
