// The bf16 decode GEMV; see bf16_gemv.h.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/bf16_gemv.h"

namespace megactx::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kChunk = 8;               // bf16 values per 16-byte load
constexpr int kWarpStep = 32 * kChunk;  // k a warp covers per load

// 8 bf16 values (4 words, low half first) as floats.
__device__ __forceinline__ void unpack8(uint4 packed, float out[8]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// A warp takes kMats weight rows: with kSwiglu, gate row u and up row
// out + u of w for output column u (silu(gate) * up); otherwise the kMats
// adjacent rows u kMats .. u kMats + kMats - 1, one output column each.
// Lane `lane` reads k = 8 lane, + 256, ...: kUnroll loads per weight row in
// flight before their products. A column's sum runs in the same order for
// any kRows, kMats and kUnroll, so its bits do not depend on them.
template <int kRows, int kUnroll, int kMats, bool kSwiglu>
__global__ void __launch_bounds__(kWarps * 32) bf16_gemv_kernel(Bf16Gemv g) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t units = kSwiglu ? g.out : (g.out + kMats - 1) / kMats;
  // Weight row and output column of the warp's m-th row.
  const auto weight_row = [&](int m) { return kSwiglu ? m * g.out + unit : unit * kMats + m; };
  const auto* w = static_cast<const uint16_t*>(g.w);
  {
    // The block's weight rows are contiguous (per matrix with kSwiglu): one
    // prefetch each before the wait (weights are never written by a step).
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps;
    if (g.prefetch_weights && threadIdx.x == 0) {
      const int64_t block_units = units - first < kWarps ? units - first : kWarps;
      if constexpr (kSwiglu) {
        for (int m = 0; m < 2; ++m)
          prefetch_l2(w + (m * g.out + first) * g.in, block_units * g.in * 2);
      } else {
        const int64_t rows_left = g.out - first * kMats;
        const int64_t rows = block_units * kMats < rows_left ? block_units * kMats : rows_left;
        prefetch_l2(w + first * kMats * g.in, rows * g.in * 2);
      }
    }
  }
  grid_dependency_wait();
  grid_dependency_trigger();
  if (unit >= units) return;  // the whole warp: no shuffle below is left half-empty
  const auto* x = static_cast<const uint16_t*>(g.x);
  bool valid[kMats];  // a last unit may have fewer than kMats rows
#pragma unroll
  for (int m = 0; m < kMats; ++m) valid[m] = kSwiglu || weight_row(m) < g.out;
  float acc[kMats][kRows];
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
  for (int64_t k0 = static_cast<int64_t>(lane) * kChunk; k0 < g.in; k0 += kUnroll * kWarpStep) {
    uint4 packed[kMats][kUnroll];
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      const uint16_t* w_row = w + (valid[m] ? weight_row(m) : 0) * g.in;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = k0 + u * kWarpStep;
        packed[m][u] = k < g.in && valid[m] ? __ldg(reinterpret_cast<const uint4*>(w_row + k))
                                            : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kWarpStep;
      if (k >= g.in) break;
      float wv[kMats][8];
#pragma unroll
      for (int m = 0; m < kMats; ++m) unpack8(packed[m][u], wv[m]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= g.rows) break;  // kRows rounds rows up to 4 or 8
        float xv[8];
        unpack8(*reinterpret_cast<const uint4*>(x + r * g.x_stride + k), xv);
#pragma unroll
        for (int m = 0; m < kMats; ++m)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(xv[j], wv[m][j], acc[m][r]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int offset = 16; offset > 0; offset /= 2)
        acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], offset);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= g.rows) break;
    if constexpr (kSwiglu) {
      // silu_mul_bf16's expression on the bf16-rounded gate and up: the bits
      // of linear_to_bf16 followed by silu_mul_bf16.
      const float gate = __bfloat162float(__float2bfloat16_rn(acc[0][r]));
      const float up = __bfloat162float(__float2bfloat16_rn(acc[1][r]));
      static_cast<__nv_bfloat16*>(g.y)[r * g.y_stride + unit] =
          __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up);
    } else {
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        if (!valid[m]) break;
        const int64_t index = r * g.y_stride + weight_row(m);
        if (g.y_f32) {
          static_cast<float*>(g.y)[index] = acc[m][r];
        } else {
          static_cast<__nv_bfloat16*>(g.y)[index] = __float2bfloat16_rn(acc[m][r]);
        }
      }
    }
  }
}

template <int kRows>
void launch(const Bf16Gemv& g, cudaStream_t stream) {
  const auto blocks = [&](int64_t units) {
    return static_cast<unsigned>((units + kWarps - 1) / kWarps);
  };
  if (g.swiglu) {
    // Two weight rows per warp: half the unroll keeps the loads in flight
    // (and the registers) of the plain kernel.
    constexpr int kUnroll = kRows <= 4 ? 2 : 1;
    launch_kernel(bf16_gemv_kernel<kRows, kUnroll, 2, true>, blocks(g.out), kWarps * 32, 0, stream,
                  g);
  } else {
    // Up to 4 rows: 4 loads in flight (more rows hold more x registers per load).
    constexpr int kUnroll = kRows <= 4 ? 4 : 2;
    launch_kernel(bf16_gemv_kernel<kRows, kUnroll, 1, false>, blocks(g.out), kWarps * 32, 0, stream,
                  g);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool bf16_gemv(const Bf16Gemv& g, cudaStream_t stream) {
  if (g.rows < 1 || g.rows > kBf16GemvMaxRows || g.in % kChunk != 0 || g.x_stride % kChunk != 0 ||
      !aligned16(g.x) || !aligned16(g.w) || g.out < 1)
    return false;
  if (g.rows == 1) {
    launch<1>(g, stream);
  } else if (g.rows == 2) {
    launch<2>(g, stream);
  } else if (g.rows <= 4) {
    launch<4>(g, stream);
  } else {
    launch<8>(g, stream);
  }
  return true;
}

}  // namespace megactx::cuda
