// Per-token-group e4m3 quantisation of GEMM inputs for the fp8 weight path
// (quantize_e4m3_groups in gemm.h). One warp per 1x128 group: each lane holds
// 4 values (lane, lane + 32, lane + 64, lane + 96: coalesced loads), the warp
// reduces the group's amax with shuffles, lane 0 writes the scale.
#include <cuda_fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/gemm.h"

namespace megactx::cuda {
namespace {

constexpr int kGroup = 128;
constexpr int kE4m3Max = 448;

__global__ void quantize_e4m3_groups_kernel(const float* x, int64_t rows, int64_t in,
                                            int64_t x_stride, uint8_t* q, float* scale,
                                            bool scales_by_group) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t groups = (in + kGroup - 1) / kGroup;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  // The whole warp shares `warp`, so it leaves (or stays) together and the
  // full-mask shuffles below see all 32 lanes.
  if (warp >= rows * groups) return;
  const int64_t row = warp / groups;
  const int64_t col0 = (warp % groups) * kGroup;
  float values[kGroup / 32];
  float amax = 0.0f;
  for (int i = 0; i < kGroup / 32; ++i) {
    const int64_t col = col0 + lane + 32 * i;
    values[i] = col < in ? x[row * x_stride + col] : 0.0f;
    amax = fmaxf(amax, fabsf(values[i]));
  }
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  // __fdiv_rn: IEEE division whatever the compile flags, so the host
  // emulation of this rounding (tests) is bit-exact.
  const float s = amax > 0.0f ? __fdiv_rn(amax, static_cast<float>(kE4m3Max)) : 1.0f;
  for (int i = 0; i < kGroup / 32; ++i) {
    const int64_t col = col0 + lane + 32 * i;
    // Round to nearest even, saturating to +-448 (x / s can round past 448).
    if (col < in) q[row * in + col] = __nv_fp8_e4m3(__fdiv_rn(values[i], s)).__x;
  }
  if (lane == 0)
    scale[scales_by_group ? (col0 / kGroup) * rows + row : row * groups + col0 / kGroup] = s;
}

}  // namespace

void quantize_e4m3_groups(const float* x, int64_t rows, int64_t in, int64_t x_stride, uint8_t* q,
                          float* scale, cudaStream_t stream, bool scales_by_group) {
  const int64_t warps = rows * ((in + kGroup - 1) / kGroup);
  if (warps == 0) return;
  constexpr int kThreads = 256;
  constexpr int64_t kWarpsPerBlock = kThreads / 32;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  launch_kernel(quantize_e4m3_groups_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, x,
                rows, in, x_stride, q, scale, scales_by_group);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
