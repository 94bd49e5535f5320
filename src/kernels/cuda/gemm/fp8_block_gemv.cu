// The decode shape of the fp8 block-scaled GEMM (fp8_block_gemm.h): a few
// rows of e4m3 inputs against a weight that must be streamed once. One warp
// per output column walks its weight row in 16-byte loads (16 e4m3 values
// of one 128-column block, so one weight scale and one input-group scale per
// load); each lane accumulates every row, then the warp reduces. The products
// are the tiled kernel's (e4m3 x * its group scale times e4m3 w * its block
// scale, in float32); only the summation order differs.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/fp8_block_gemm.h"

namespace megactx::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBytesPerLane = 16;
constexpr int kWarpStep = 32 * kBytesPerLane;  // columns a warp covers per step
constexpr int kBlockScale = 128;

__device__ float e4m3_to_float(uint32_t bits) {
  __nv_fp8_e4m3 value;
  value.__x = static_cast<__nv_fp8_storage_t>(bits);
  return static_cast<float>(value);
}

// 16 e4m3 bytes (little-endian in the 4 words) times `scale`.
__device__ void unpack16(uint4 packed, float scale, float out[16]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      out[4 * i + j] = e4m3_to_float((words[i] >> (8 * j)) & 0xffu) * scale;
}

template <int kRows>
__global__ void fp8_block_gemv_kernel(Fp8BlockGemm g) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (col >= g.out) return;  // the whole warp: no shuffle below is left half-empty
  const int64_t groups = (g.in + kBlockScale - 1) / kBlockScale;
  const uint8_t* w_row = g.w + col * g.in;                                       // [in]
  const float* w_scales = g.scale + fp8_scale_row(col, g.scale_split) * groups;  // [groups]
  const auto* x = static_cast<const uint8_t*>(g.x);  // [kRows, x_stride]
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  for (int64_t k = static_cast<int64_t>(lane) * kBytesPerLane; k < g.in; k += kWarpStep) {
    float w[16];
    unpack16(*reinterpret_cast<const uint4*>(w_row + k), w_scales[k / kBlockScale], w);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float xv[16];
      unpack16(*reinterpret_cast<const uint4*>(x + r * g.x_stride + k),
               g.x_scale[r * groups + k / kBlockScale], xv);
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[r] += xv[j] * w[j];
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    for (int offset = 16; offset > 0; offset /= 2)
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t index = r * g.y_stride + col;
    if (g.y_type == ActType::F32) {
      static_cast<float*>(g.y)[index] = acc[r];
    } else {
      static_cast<__nv_bfloat16*>(g.y)[index] = __float2bfloat16_rn(acc[r]);
    }
  }
}

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <int kRows>
void launch(const Fp8BlockGemm& g, cudaStream_t stream) {
  const int64_t blocks = (g.out + kWarpsPerBlock - 1) / kWarpsPerBlock;
  launch_kernel(fp8_block_gemv_kernel<kRows>, static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                stream, g);
}

}  // namespace

bool fp8_block_gemv(const Fp8BlockGemm& g, cudaStream_t stream) {
  // 16-byte loads of whole rows: `in` and the input row stride in multiples
  // of 16 bytes, 16-byte aligned bases.
  if (g.x_type != ActType::E4M3 || g.rows < 1 || g.rows > kFp8GemvMaxRows || g.in % 16 != 0 ||
      g.x_stride % 16 != 0 || !aligned16(g.x) || !aligned16(g.w)) {
    return false;
  }
  if (g.out == 0) return true;
  switch (g.rows) {
    case 1:
      launch<1>(g, stream);
      break;
    case 2:
      launch<2>(g, stream);
      break;
    case 3:
      launch<3>(g, stream);
      break;
    case 4:
      launch<4>(g, stream);
      break;
    case 5:
      launch<5>(g, stream);
      break;
    case 6:
      launch<6>(g, stream);
      break;
    case 7:
      launch<7>(g, stream);
      break;
    default:
      launch<8>(g, stream);
      break;
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace megactx::cuda
