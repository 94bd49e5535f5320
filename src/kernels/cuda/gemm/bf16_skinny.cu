// The bf16 few-row tensor-core linear; see bf16_skinny.h.
//
// Operand layout (as the bf16 routed experts, moe/grouped_experts_mma.cu):
// the order of the k terms in a dot product is free, so each lane loads 16
// contiguous bytes (8 k values) of its two weight rows and of its input row,
// and the MMA's logical k of lane (g, t) -- 2t, 2t+1, 2t+8, 2t+9 of each
// 16-wide step -- is physical k 8t + 4s + 0..3 of a 32-wide block (s = step
// 0 or 1). The mapping depends on t and k only, so weights and inputs agree.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/bf16_skinny.h"
#include "kernels/cuda/moe/split_k_parts.cuh"

namespace megactx::cuda {
namespace {

constexpr int kBlocksPerStep = 4;  // 32-wide k blocks of weights loaded before their MMAs
// Grids of at most this many CTAs per multiprocessor (4 weight-row warps per
// CTA) take the split along k.
constexpr int64_t kSplitMaxCtasPerSm = 2;

// kWarps weight-row warps per CTA, each times kSplit warps along k. Grid
// (ceil(out / (16 kWarps)), ceil(rows / (8 kGroups))); with kSwiglu a warp
// takes gate rows j .. j + 7 and up rows out + j .. out + j + 7 as its 16
// (the grid is the same: out / 8 such warps).
template <int kGroups, int kWarps, int kSplit, bool kSwiglu>
__global__ void __launch_bounds__(32 * kWarps * kSplit) bf16_skinny_kernel(Bf16Skinny g) {
  // Other parts' sums: [kSplit - 1][kWarps][kGroups * 4][32] (sum_split_parts).
  __shared__ float partial[kSplit > 1 ? (kSplit - 1) * kWarps * kGroups * 4 * 32 : 1];
  grid_dependency_wait();
  grid_dependency_trigger();
  const int warp = static_cast<int>(threadIdx.x) / 32 % kWarps,
            lane = static_cast<int>(threadIdx.x) % 32;
  const int part = static_cast<int>(threadIdx.x) / (32 * kWarps);  // this warp's share of k
  const int gq = lane / 4, t = lane % 4;
  // Lane (gq, t) holds weight rows first + gq and first + gq + 8 (kSwiglu:
  // gate row first + gq and up row out + first + gq).
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * (kSwiglu ? 8 : 16);
  const int64_t low_row = first + gq, high_row = kSwiglu ? g.out + first + gq : first + gq + 8;
  const bool low_valid = low_row < g.out, high_valid = kSwiglu ? low_valid : high_row < g.out;
  const auto* w = static_cast<const __nv_bfloat16*>(g.w);
  const __nv_bfloat16* low = w + (low_valid ? low_row : 0) * g.in;
  const __nv_bfloat16* high = w + (high_valid ? high_row : 0) * g.in;
  // The tile's input rows: column gq of group q is row row0 + 8q + gq.
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 8 * kGroups;
  const auto* x = static_cast<const __nv_bfloat16*>(g.x);
  const __nv_bfloat16* x_row[kGroups];
  bool x_valid[kGroups];
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int64_t r = row0 + 8 * q + gq;
    x_valid[q] = r < g.rows;
    x_row[q] = x + (x_valid[q] ? r : 0) * g.x_stride;
  }
  // Column groups past the batch's rows are skipped (uniform over the CTA).
  const int64_t tile_rows = g.rows - row0 < 8 * kGroups ? g.rows - row0 : 8 * kGroups;
  const int groups = static_cast<int>((tile_rows + 7) / 8);

  // c[q]: weight rows gq (c[q][0..1]) and gq + 8 (c[q][2..3]) at input rows
  // row0 + 8q + 2t, + 1.
  float c[kGroups][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[q][i] = 0.0f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int64_t kb = 32 * kBlocksPerStep * part; kb < g.in; kb += 32 * kBlocksPerStep * kSplit) {
    uint4 w_low[kBlocksPerStep], w_high[kBlocksPerStep];
#pragma unroll
    for (int b = 0; b < kBlocksPerStep; ++b) {
      const int64_t k = kb + 32 * b + 8 * t;  // this lane's 8 values of block b
      const bool in_range = k < g.in;         // whole 8-value segments: in % 8 == 0
      w_low[b] = in_range && low_valid ? __ldg(reinterpret_cast<const uint4*>(low + k)) : zero;
      w_high[b] = in_range && high_valid ? __ldg(reinterpret_cast<const uint4*>(high + k)) : zero;
    }
#pragma unroll
    for (int b = 0; b < kBlocksPerStep; ++b) {
      if (kb + 32 * b >= g.in) break;  // uniform: the last block was done
      const int64_t k = kb + 32 * b + 8 * t;
      const uint32_t step0[4] = {w_low[b].x, w_high[b].x, w_low[b].y, w_high[b].y};
      const uint32_t step1[4] = {w_low[b].z, w_high[b].z, w_low[b].w, w_high[b].w};
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        if (q >= groups) break;
        const uint4 xv =
            k < g.in && x_valid[q] ? __ldg(reinterpret_cast<const uint4*>(x_row[q] + k)) : zero;
        mma_bf16_16x8x16(c[q], step0, xv.x, xv.y);
        mma_bf16_16x8x16(c[q], step1, xv.z, xv.w);
      }
    }
  }
  if constexpr (kSplit > 1) {
    if (!sum_split_parts<kSplit, kWarps, kGroups>(c, partial, part, warp, lane)) return;
  }
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t r = row0 + 8 * q + 2 * t + i;  // input row of c[q][i] and c[q][2 + i]
      if (r >= g.rows) continue;
      const int64_t base = r * g.y_stride;
      if constexpr (kSwiglu) {
        // silu_mul_bf16's expression on the bf16-rounded gate and up: the
        // bits of the plain kernel into bf16 followed by silu_mul_bf16.
        const float gate = __bfloat162float(__float2bfloat16_rn(c[q][i]));
        const float up = __bfloat162float(__float2bfloat16_rn(c[q][2 + i]));
        if (low_valid)
          static_cast<__nv_bfloat16*>(g.y)[base + low_row] =
              __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up);
      } else if (g.y_f32) {
        auto* y = static_cast<float*>(g.y);
        if (low_valid) y[base + low_row] = c[q][i];
        if (high_valid) y[base + high_row] = c[q][2 + i];
      } else {
        auto* y = static_cast<__nv_bfloat16*>(g.y);
        if (low_valid) y[base + low_row] = __float2bfloat16_rn(c[q][i]);
        if (high_valid) y[base + high_row] = __float2bfloat16_rn(c[q][2 + i]);
      }
    }
  }
}

// Large grids: 4 weight-row warps per CTA, no split. Small ones (at most two
// CTAs per multiprocessor that way): one weight-row warp per CTA, times 8
// along k, so that the CTAs spread over every SM and 8 times the loads are
// in flight.
template <int kGroups, bool kSwiglu>
void launch(const Bf16Skinny& g, cudaStream_t stream) {
  // Output columns per weight-row warp: 16, or 8 gate / up pairs.
  constexpr int kColumns = kSwiglu ? 8 : 16;
  const auto grid = [&](int warps) {
    return dim3(static_cast<unsigned>((g.out + kColumns * warps - 1) / (kColumns * warps)),
                static_cast<unsigned>((g.rows + 8 * kGroups - 1) / (8 * kGroups)));
  };
  const dim3 wide = grid(4);
  const int64_t ctas = static_cast<int64_t>(wide.x) * wide.y;
  const bool split = g.split == 8 || (g.split == 0 && ctas <= kSplitMaxCtasPerSm *
                                                                  current_device_multiprocessors());
  if (split)
    launch_kernel(bf16_skinny_kernel<kGroups, 1, 8, kSwiglu>, grid(1), 32 * 8, 0, stream, g);
  else
    launch_kernel(bf16_skinny_kernel<kGroups, 4, 1, kSwiglu>, wide, 32 * 4, 0, stream, g);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

template <int kGroups>
void launch(const Bf16Skinny& g, cudaStream_t stream) {
  if (g.swiglu)
    launch<kGroups, true>(g, stream);
  else
    launch<kGroups, false>(g, stream);
}

}  // namespace

bool bf16_skinny(const Bf16Skinny& g, cudaStream_t stream) {
  if (g.rows < 1 || g.rows > kBf16SkinnyMaxRows || g.in < 8 || g.in % 8 != 0 ||
      g.x_stride % 8 != 0 || !aligned16(g.x) || !aligned16(g.w) || g.out < 1 ||
      (g.split != 0 && g.split != 1 && g.split != 8))
    return false;
  if (g.rows <= 8) {
    launch<1>(g, stream);
  } else if (g.rows <= 16) {
    launch<2>(g, stream);
  } else {
    launch<4>(g, stream);
  }
  return true;
}

}  // namespace megactx::cuda
