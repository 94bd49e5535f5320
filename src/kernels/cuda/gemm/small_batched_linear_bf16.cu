// The few-row batched bf16 linear of small_batched_linear.h on mma.sync
// m16n8k16 (float32 accumulators): a block of 4 warps per (batch b, 64
// outputs), each warp 16 outputs (two n8 tiles) for every row (kMTiles m16
// tiles, rows past g.rows zero). The block's x rows [kMTiles * 16, in] are
// staged in shared memory once (pitch in + 32 bf16: rows g and g + 1 of a
// quarter-warp's 16-byte loads fall in different banks); the weights stream
// from global memory, 16 bytes per thread and 32-wide k block, several blocks
// in flight.
//
// The k order inside a 32-wide block is permuted so that each thread reads 16
// contiguous bytes of its weight row and of its x rows: thread t of a quad
// holds k = 8t .. 8t + 7 as four bf16 pairs p0..p3; the first m16n8k16 step
// takes (p0, p1) as the fragment's (k 2t, 2t + 1) and (k 2t + 8, 2t + 9)
// pairs, the second (p2, p3). A and B use the same map, so the dot product is
// the same sum in another order.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/gemm/small_batched_linear.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kOutputsPerWarp = 16;
constexpr int kOutputsPerBlock = (kThreads / 32) * kOutputsPerWarp;  // 64
constexpr int kPadElements = 32;                                     // x row pitch: in + 32
constexpr int kUnroll = 8;  // 32-wide k blocks of weights in flight per thread
constexpr int64_t kMaxIn = 1024;

template <int kMTiles>
__device__ __forceinline__ void k_block(float (&acc)[kMTiles][2][4], const uint8_t* xs, int pitch,
                                        int kb, int grp, int t, const uint4 (&wv)[2]) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    const uint8_t* row = xs + (16 * m + grp) * pitch + (32 * kb + 8 * t) * 2;
    const uint4 xa = *reinterpret_cast<const uint4*>(row);
    const uint4 xb = *reinterpret_cast<const uint4*>(row + 8 * pitch);
    const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y};
    const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mma_bf16_16x8x16(acc[m][j], a0, wv[j].x, wv[j].y);
      mma_bf16_16x8x16(acc[m][j], a1, wv[j].z, wv[j].w);
    }
  }
}

template <int kMTiles, bool kYF32>
__global__ void __launch_bounds__(kThreads)
    small_batched_linear_bf16_kernel(SmallBatchedLinearBf16 g) {
  extern __shared__ uint4 staged[];
  uint8_t* xs = reinterpret_cast<uint8_t*>(staged);  // [kMTiles * 16][in + kPadElements] bf16
  const int in = static_cast<int>(g.in);
  const int pitch = (in + kPadElements) * 2;
  const int64_t b = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int grp = lane / 4, t = lane % 4;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kOutputsPerBlock + warp * kOutputsPerWarp;
  // out is a multiple of 16: a warp has all its outputs or none.
  const bool active = o0 < g.out;
  const uint16_t* w = static_cast<const uint16_t*>(g.w) + b * g.w_batch_stride;
  const int64_t w_row = active ? o0 + grp : 0;
  const uint4* w_rows[2] = {reinterpret_cast<const uint4*>(w + w_row * g.in),
                            reinterpret_cast<const uint4*>(w + (w_row + 8) * g.in)};
  const int blocks = in / 32;
  // The first kUnroll k blocks of weights, requested before x is staged (they
  // do not depend on it); afterwards each block's registers are refilled with
  // the block kUnroll further on right after its MMAs: kUnroll blocks in flight.
  uint4 wv[kUnroll][2];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (active && u < blocks) wv[u][j] = __ldg(w_rows[j] + u * 4 + t);

  const uint16_t* x = static_cast<const uint16_t*>(g.x) + b * g.x_batch_stride;
  const int chunks = in / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kMTiles * 16 * chunks; i += kThreads) {
    const int r = i / chunks, c = i % chunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < g.rows) v = *reinterpret_cast<const uint4*>(x + r * g.x_stride + c * 8);
    *reinterpret_cast<uint4*>(xs + r * pitch + c * 16) = v;
  }
  __syncthreads();
  if (!active) return;

  float acc[kMTiles][2][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;

  for (int kb0 = 0; kb0 < blocks; kb0 += kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kb = kb0 + u;
      if (kb < blocks) {
        k_block<kMTiles>(acc, xs, pitch, kb, grp, t, wv[u]);
        if (kb + kUnroll < blocks)
#pragma unroll
          for (int j = 0; j < 2; ++j) wv[u][j] = __ldg(w_rows[j] + (kb + kUnroll) * 4 + t);
      }
    }
  }

  // acc[m][j]: rows 16m + grp (e 0, 1) and 16m + grp + 8 (e 2, 3), outputs
  // o0 + 8j + 2t, + 1.
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = 16 * m + grp + 8 * half;
      if (r >= g.rows) continue;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t at = b * g.y_batch_stride + r * g.y_stride + o0 + 8 * j + 2 * t;
        const float v0 = acc[m][j][2 * half], v1 = acc[m][j][2 * half + 1];
        if constexpr (kYF32) {
          *reinterpret_cast<float2*>(static_cast<float*>(g.y) + at) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<uint16_t*>(g.y) + at) =
              __floats2bfloat162_rn(v0, v1);
        }
      }
    }
}

template <int kMTiles, bool kYF32>
void launch(const SmallBatchedLinearBf16& g, cudaStream_t stream) {
  constexpr int kMaxShared = kMTiles * 16 * (static_cast<int>(kMaxIn) + kPadElements) * 2;
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(small_batched_linear_bf16_kernel<kMTiles, kYF32>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kMaxShared));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>((g.out + kOutputsPerBlock - 1) / kOutputsPerBlock),
                  static_cast<unsigned>(g.batch));
  const size_t shared =
      static_cast<size_t>(kMTiles * 16) * static_cast<size_t>(g.in + kPadElements) * 2;
  small_batched_linear_bf16_kernel<kMTiles, kYF32><<<grid, kThreads, shared, stream>>>(g);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

template <int kMTiles>
void launch_rows(const SmallBatchedLinearBf16& g, cudaStream_t stream) {
  g.y_f32 ? launch<kMTiles, true>(g, stream) : launch<kMTiles, false>(g, stream);
}

}  // namespace

bool small_batched_linear_bf16(const SmallBatchedLinearBf16& g, cudaStream_t stream) {
  if (g.rows < 1 || g.rows > kSmallBatchedLinearBf16MaxRows || g.in < 32 || g.in % 32 != 0 ||
      g.in > kMaxIn || g.out < 16 || g.out % 16 != 0 || g.batch < 1 || g.batch > 65535)
    return false;
  if (!aligned16(g.x) || !aligned16(g.w) || g.x_stride % 8 != 0 || g.x_batch_stride % 8 != 0 ||
      g.w_batch_stride % 8 != 0)
    return false;
  const uintptr_t y_align = g.y_f32 ? 8u : 4u;
  if ((reinterpret_cast<uintptr_t>(g.y) & (y_align - 1)) != 0 || g.y_stride % 2 != 0 ||
      g.y_batch_stride % 2 != 0)
    return false;
  if (g.rows <= 16) {
    launch_rows<1>(g, stream);
  } else if (g.rows <= 32) {
    launch_rows<2>(g, stream);
  } else if (g.rows <= 48) {
    launch_rows<3>(g, stream);
  } else {
    launch_rows<4>(g, stream);
  }
  return true;
}

}  // namespace megactx::cuda
