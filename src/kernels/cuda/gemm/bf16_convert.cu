// float32 -> bf16 rows for the bf16 GEMM path of Blas (gemm.h).
#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/row_launch.cuh"
#include "kernels/cuda/gemm/gemm.h"

namespace megactx::cuda {
namespace {

// On row_launch (common/row_launch.cuh). Vec: four columns per thread (float4
// loads, 8-byte stores).
template <bool Vec>
__global__ void float_to_bf16_kernel(const float* x, int64_t rows, int64_t n, int64_t x_stride,
                                     uint16_t* y) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (ROW_LAUNCH_ROWS(r, rows)) {
    const float* source = x + r * x_stride;
    uint16_t* out = y + r * n;
    if constexpr (Vec) {
      for (ROW_LAUNCH_COLUMNS(q, n / 4)) {
        const float4 v = reinterpret_cast<const float4*>(source)[q];
        // Two bf16 per word (float_to_bf16_bits: integer rounding, whole-word stores).
        reinterpret_cast<uint2*>(out)[q] =
            make_uint2(float_to_bf16_bits(v.x) | (uint32_t{float_to_bf16_bits(v.y)} << 16),
                       float_to_bf16_bits(v.z) | (uint32_t{float_to_bf16_bits(v.w)} << 16));
      }
    } else {
      for (ROW_LAUNCH_COLUMNS(c, n)) out[c] = float_to_bf16_bits(source[c]);
    }
  }
}

}  // namespace

void float_to_bf16_rows(const float* x, int64_t rows, int64_t n, int64_t x_stride, void* y,
                        cudaStream_t stream) {
  if (rows * n == 0) return;
  auto* out = static_cast<uint16_t*>(y);
  const bool vec = n % 4 == 0 && x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 8 == 0;
  if (vec) {
    const RowLaunch shape = row_launch(rows, n / 4);
    launch_kernel(float_to_bf16_kernel<true>, shape.grid, shape.block, 0, stream, x, rows, n,
                  x_stride, out);
  } else {
    const RowLaunch shape = row_launch(rows, n);
    launch_kernel(float_to_bf16_kernel<false>, shape.grid, shape.block, 0, stream, x, rows, n,
                  x_stride, out);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
