// Tiled fp8 block-scaled GEMM; see fp8_block_gemm.h. Each block computes a
// 64 (rows) x 64 (out) tile; the K loop stages 32 columns of x and of the
// dequantized weights in shared memory. A 32-wide K step never crosses a
// 128 block, so one scale per weight row serves the whole step.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"

namespace megactx::cuda {
namespace {

constexpr int kTile = 64;
constexpr int kStep = 32;
constexpr int kBlockScale = 128;

__device__ float e4m3_to_float(uint8_t bits) {
  __nv_fp8_e4m3 value;
  value.__x = bits;
  return static_cast<float>(value);
}

// x[row, k] as float32; e4m3 inputs times their group's scale.
__device__ float load_act(const Fp8BlockGemm& g, int64_t row, int64_t k) {
  const int64_t index = row * g.x_stride + k;
  switch (g.x_type) {
    case ActType::F32:
      return static_cast<const float*>(g.x)[index];
    case ActType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(g.x)[index]);
    case ActType::E4M3:
      break;
  }
  const int64_t groups = (g.in + kBlockScale - 1) / kBlockScale;
  return e4m3_to_float(static_cast<const uint8_t*>(g.x)[index]) *
         g.x_scale[row * groups + k / kBlockScale];
}

// 256 threads: thread (ty, tx) of 16 x 16 owns a 4 x 4 sub-tile.
__global__ void fp8_block_gemm_kernel(Fp8BlockGemm g) {
  __shared__ float xs[kTile][kStep + 1];
  __shared__ float ws[kTile][kStep + 1];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t scale_cols = (g.in + kBlockScale - 1) / kBlockScale;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < g.in; k0 += kStep) {
    for (int i = threadIdx.x; i < kTile * kStep; i += blockDim.x) {
      const int r = i / kStep, k = i % kStep;
      const int64_t row = row0 + r, col = col0 + r, kk = k0 + k;
      xs[r][k] = (row < g.rows && kk < g.in) ? load_act(g, row, kk) : 0.0f;
      float w = 0.0f;
      if (col < g.out && kk < g.in) {
        w = e4m3_to_float(g.w[col * g.in + kk]) *
            g.scale[fp8_scale_row(col, g.scale_split) * scale_cols + kk / kBlockScale];
      }
      ws[r][k] = w;
    }
    __syncthreads();
    for (int k = 0; k < kStep; ++k) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = xs[ty * 4 + i][k];
      for (int j = 0; j < 4; ++j) b[j] = ws[tx * 4 + j][k];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty * 4 + i;
    if (row >= g.rows) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx * 4 + j;
      if (col >= g.out) continue;
      const int64_t index = row * g.y_stride + col;
      if (g.y_type == ActType::F32) {
        static_cast<float*>(g.y)[index] = acc[i][j];
      } else {
        static_cast<__nv_bfloat16*>(g.y)[index] = __float2bfloat16_rn(acc[i][j]);
      }
    }
  }
}

}  // namespace

void fp8_block_gemm(const Fp8BlockGemm& g, cudaStream_t stream) {
  if (g.rows == 0 || g.out == 0) return;
  const dim3 grid(static_cast<unsigned>((g.out + kTile - 1) / kTile),
                  static_cast<unsigned>((g.rows + kTile - 1) / kTile));
  fp8_block_gemm_kernel<<<grid, 256, 0, stream>>>(g);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
