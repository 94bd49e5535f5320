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
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/bf16_skinny.h"

namespace megactx::cuda {
namespace {

constexpr int kWarps = kBf16SkinnyWarps;  // weight-row warps per CTA, 16 weight rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = kBf16SkinnyChunk;  // k per pipeline step
constexpr int kBlocks = kChunk / 32;      // 32-wide k blocks per chunk (one 16-byte load per lane)
constexpr int kSegments = kChunk / 8;     // 16-byte segments of an x row per chunk
constexpr int kRowBytes = 2 * kChunk + 64;  // staged x row: 64 bytes of padding keep
                                            // the 8 lanes of a load phase on distinct banks

// Grid (tiles, split). With kSwiglu a warp takes gate rows j .. j + 7 and up
// rows out + j .. out + j + 7 as its 16 (a tile is 64 output columns);
// otherwise 16 adjacent weight rows (a tile is 128 output columns). Part
// blockIdx.y takes chunks [y chunks_per_part, (y + 1) chunks_per_part).
template <int kGroups, bool kSwiglu>
__global__ void __launch_bounds__(kThreads)
    bf16_skinny_kernel(Bf16Skinny g, int split, int64_t chunks_per_part) {
  constexpr int kRows = 8 * kGroups;  // input rows a CTA stages (the batch rounded up to 8)
  __shared__ __align__(16) uint8_t x_tile[2][kRows * kRowBytes];
  __shared__ bool last;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gq = lane / 4, t = lane % 4;
  const int64_t tile = blockIdx.x;
  // Lane (gq, t) holds weight rows first + gq and first + gq + 8 (kSwiglu:
  // gate row first + gq and up row out + first + gq).
  const int64_t first = (tile * kWarps + warp) * (kSwiglu ? 8 : 16);
  const int64_t low_row = first + gq, high_row = kSwiglu ? g.out + first + gq : first + gq + 8;
  const bool low_valid = low_row < g.out, high_valid = kSwiglu ? low_valid : high_row < g.out;
  const auto* w = static_cast<const __nv_bfloat16*>(g.w);
  const __nv_bfloat16* low = w + (low_valid ? low_row : 0) * g.in;
  const __nv_bfloat16* high = w + (high_valid ? high_row : 0) * g.in;
  const auto* x = static_cast<const __nv_bfloat16*>(g.x);
  const int groups = static_cast<int>((g.rows + 7) / 8);  // <= kGroups
  const int64_t chunks = (g.in + kChunk - 1) / kChunk;
  const int64_t chunk_begin = static_cast<int64_t>(blockIdx.y) * chunks_per_part;
  const int64_t chunk_end =
      chunk_begin + chunks_per_part < chunks ? chunk_begin + chunks_per_part : chunks;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  const auto load_weights = [&](int64_t chunk, uint4(&w_low)[kBlocks], uint4(&w_high)[kBlocks]) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int64_t k = chunk * kChunk + 32 * b + 8 * t;  // this lane's 8 values of block b
      const bool in_range = k < g.in;                     // whole segments: in % 8 == 0
      w_low[b] = in_range && low_valid ? __ldg(reinterpret_cast<const uint4*>(low + k)) : zero;
      w_high[b] = in_range && high_valid ? __ldg(reinterpret_cast<const uint4*>(high + k)) : zero;
    }
  };
  // x [kRows, kChunk] of `chunk` into x_tile[buffer]; rows past the batch
  // and k past `in` are zeros, so their products add nothing.
  const auto stage_x = [&](int64_t chunk, int buffer) {
    for (int i = static_cast<int>(threadIdx.x); i < kRows * kSegments; i += kThreads) {
      const int r = i / kSegments, s = i % kSegments;
      const int64_t k = chunk * kChunk + 8 * s;
      uint8_t* destination = x_tile[buffer] + r * kRowBytes + 16 * s;
      if (r < g.rows && k < g.in)
        cp_async_16(destination, x + r * g.x_stride + k);
      else
        *reinterpret_cast<uint4*>(destination) = zero;
    }
    cp_async_commit();
  };

  uint4 w_low[kBlocks], w_high[kBlocks];
  // Weights are never written by a step: the first chunk's loads need not wait.
  if (chunk_begin < chunk_end) load_weights(chunk_begin, w_low, w_high);
  grid_dependency_wait();
  grid_dependency_trigger();

  // c[q]: weight rows gq (c[q][0..1]) and gq + 8 (c[q][2..3]) at input rows
  // 8q + 2t, + 1.
  float c[kGroups][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[q][i] = 0.0f;
  if (chunk_begin < chunk_end) stage_x(chunk_begin, 0);
  for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int buffer = static_cast<int>((chunk - chunk_begin) & 1);
    const bool more = chunk + 1 < chunk_end;
    uint4 next_low[kBlocks], next_high[kBlocks];
    if (more) {
      // The other buffer was last read before the barrier ending the previous step.
      stage_x(chunk + 1, buffer ^ 1);
      load_weights(chunk + 1, next_low, next_high);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this chunk's x is in shared memory
    const uint8_t* staged = x_tile[buffer] + gq * kRowBytes + 16 * t;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const uint32_t step0[4] = {w_low[b].x, w_high[b].x, w_low[b].y, w_high[b].y};
      const uint32_t step1[4] = {w_low[b].z, w_high[b].z, w_low[b].w, w_high[b].w};
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        if (q >= groups) break;  // uniform over the CTA
        const uint4 xv = *reinterpret_cast<const uint4*>(staged + 8 * q * kRowBytes + 64 * b);
        mma_bf16_16x8x16(c[q], step0, xv.x, xv.y);
        mma_bf16_16x8x16(c[q], step1, xv.z, xv.w);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is staged again
    if (more) {
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        w_low[b] = next_low[b];
        w_high[b] = next_high[b];
      }
    }
  }

  if (split > 1) {
    // Store this part's sums; the tile's last CTA adds the parts in order.
    const int64_t weight_rows = kSwiglu ? 2 * g.out : g.out;
    const auto at = [&](int64_t part, int64_t r, int64_t weight_row) {
      return (part * g.rows + r) * weight_rows + weight_row;
    };
#pragma unroll
    for (int q = 0; q < kGroups; ++q)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t r = 8 * q + 2 * t + i;
        if (r >= g.rows) continue;
        if (low_valid) g.parts[at(blockIdx.y, r, low_row)] = c[q][i];
        if (high_valid) g.parts[at(blockIdx.y, r, high_row)] = c[q][2 + i];
      }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(g.done + tile, 1) == split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int q = 0; q < kGroups; ++q)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t r = 8 * q + 2 * t + i;
        if (r >= g.rows) continue;
        float low_sum = 0.0f, high_sum = 0.0f;
        for (int part = 0; part < split; ++part) {
          if (low_valid) low_sum += __ldcg(g.parts + at(part, r, low_row));
          if (high_valid) high_sum += __ldcg(g.parts + at(part, r, high_row));
        }
        c[q][i] = low_sum;
        c[q][2 + i] = high_sum;
      }
    if (threadIdx.x == 0) g.done[tile] = 0;
  }

#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t r = 8 * q + 2 * t + i;  // input row of c[q][i] and c[q][2 + i]
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

}  // namespace

void launch_bf16_skinny(const Bf16Skinny& g, int split, int64_t chunks_per_part,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(bf16_skinny_tiles(g)), static_cast<unsigned>(split));
  const auto launch = [&](auto kernel) {
    launch_kernel(kernel, grid, kThreads, 0, stream, g, split, chunks_per_part);
  };
  const bool sw = g.swiglu;
  if (g.rows <= 8) {
    sw ? launch(bf16_skinny_kernel<1, true>) : launch(bf16_skinny_kernel<1, false>);
  } else if (g.rows <= 16) {
    sw ? launch(bf16_skinny_kernel<2, true>) : launch(bf16_skinny_kernel<2, false>);
  } else if (g.rows <= 32) {
    sw ? launch(bf16_skinny_kernel<4, true>) : launch(bf16_skinny_kernel<4, false>);
  } else {
    sw ? launch(bf16_skinny_kernel<8, true>) : launch(bf16_skinny_kernel<8, false>);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
