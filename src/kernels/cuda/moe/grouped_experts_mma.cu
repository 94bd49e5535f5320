// bf16 routed experts on tensor cores: the grouped expert kernel of
// grouped_experts.cu with mma.sync m16n8k16 (bf16 x bf16, fp32 accumulation)
// instead of CUDA-core FMAs, so the rows of a batch (batched decode, MTP
// verification) cost no extra weight traffic: a warp's 16 weight rows are
// the MMA's M, the tile's up to 32 rows four groups of N = 8 columns.
//
// Operand layout: the order of the k terms in a dot product is free, so each
// lane loads 16 contiguous bytes (8 k values) of its two weight rows and of
// its tile rows, and the MMA's logical k of lane (g, t) -- 2t, 2t+1, 2t+8,
// 2t+9 of each 16-wide step -- is mapped to physical k 8t + 4s + 0..3 of a
// 32-wide block (s = step 0 or 1). The mapping depends on t and k only, so
// weights and inputs agree on it.
//
// kSplit > 1 (MEGACTX_BF16_EXPERT_SPLIT_K=4, off by default until measured):
// kSplit warps share each weight-row warp's work along k, each taking every
// kSplit-th step of 4 k blocks, and shared memory sums their accumulators in
// part order. Why: at one row per expert (decode at batch 1) a gate/up launch
// has ~100 CTAs of 4 warps, under 1 MB of weight loads in flight where the
// GPU needs ~3 MB to stream at its read rate (glm_1b on an H100: the experts
// read at 31% of it, docs/benchmarks.md). The partition depends on k only,
// so a row's result does not depend on the tile it shares (batch-invariant).
#include <cuda_bf16.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/moe/expert_kernels.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "kernels/cuda/moe/split_k_parts.cuh"

namespace megactx::cuda {
namespace {

constexpr int kWarps = 4;  // weight-row warps per CTA (each times kSplit along k)
constexpr int kTileRows = static_cast<int>(kGroupedMoeTileRowsBf16);
constexpr int kColumnGroups = kTileRows / 8;  // n = 8 MMAs per k step
constexpr int kChunk = 512;                   // input values per row staged per pass
// Row stride of the staged inputs in bf16: 64 bytes of padding put tile rows
// g and g + 1 on different banks for the 16-byte reads of a quarter warp.
constexpr int kStagedStride = kChunk + 32;
constexpr int kBlocksPerStep = 4;  // 32-wide k blocks of weights loaded before their MMAs

static_assert(kTileRows % 8 == 0, "tile rows come in n = 8 MMA column groups");

template <bool kGateUp, int kSplit>
__global__ void __launch_bounds__(32 * kWarps * kSplit) expert_mma_kernel(ExpertArgs a) {
  constexpr int kThreads = 32 * kWarps * kSplit;
  grid_dependency_wait();
  grid_dependency_trigger();
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *a.tile_count) return;  // the routing left this tile empty
  const int expert = a.tiles[3 * tile];
  const int start = a.tiles[3 * tile + 1];
  const int m = a.tiles[3 * tile + 2];  // 1..kTileRows

  __shared__ __align__(16) __nv_bfloat16 staged[kTileRows * kStagedStride];  // [R, chunk]
  __shared__ int64_t source[kTileRows];  // element offset of each tile row's input
  if (threadIdx.x < kTileRows) {
    int64_t row = 0;
    if (static_cast<int>(threadIdx.x) < m) {
      const int position = start + static_cast<int>(threadIdx.x);
      row = kGateUp ? a.pair_of[position] / a.top_k : position;
    }
    source[threadIdx.x] = row * a.in;
  }

  // Lane (g, t) holds weight rows g and g + 8 of the warp's 16: gate_up pairs
  // gate row j with up row I + j (neurons first .. first + 7), down takes
  // neurons first .. first + 15.
  const int warp = static_cast<int>(threadIdx.x) / 32 % kWarps,
            lane = static_cast<int>(threadIdx.x) % 32;
  const int part = static_cast<int>(threadIdx.x) / (32 * kWarps);  // this warp's share of k
  const int g = lane / 4, t = lane % 4;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * (kGateUp ? 8 : 16);
  const int64_t low_row = first + g;
  const int64_t high_row = kGateUp ? a.neurons + first + g : first + g + 8;
  const bool low_valid = low_row < a.neurons;
  const bool high_valid = kGateUp ? low_valid : high_row < a.neurons;
  const int64_t weight_rows = kGateUp ? 2 * a.neurons : a.neurons;
  const __nv_bfloat16* expert_weights = static_cast<const __nv_bfloat16*>(a.weights) +
                                        static_cast<int64_t>(expert) * weight_rows * a.in;
  const __nv_bfloat16* low = expert_weights + (low_valid ? low_row : 0) * a.in;
  const __nv_bfloat16* high = expert_weights + (high_valid ? high_row : 0) * a.in;
  // Column groups past the tile's rows are skipped (uniform over the CTA).
  const int groups = (m + 7) / 8;

  // c[q]: rows g (c[q][0..1]) and g + 8 (c[q][2..3]) at tile rows 8q + 2t, 8q + 2t + 1.
  float c[kColumnGroups][4];
#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[q][i] = 0.0f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int64_t k0 = 0; k0 < a.in; k0 += kChunk) {
    const int length = static_cast<int>(a.in - k0 < kChunk ? a.in - k0 : kChunk);  // % 8 == 0
    __syncthreads();  // the previous chunk is consumed; source[] is visible
    // Inputs rounded to bf16 (as Blas::linear's bf16 path); rows from m up
    // to the last column group used are zeros (their columns are computed
    // and never stored); later rows are never read.
    const int vectors = length / 4;
    for (int i = static_cast<int>(threadIdx.x); i < 8 * groups * vectors; i += kThreads) {
      const int r = i / vectors, v = i % vectors;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < m) x = *reinterpret_cast<const float4*>(a.input + source[r] + k0 + 4 * v);
      uint2 packed;
      packed.x = pack_bf16x2(x.x, x.y);
      packed.y = pack_bf16x2(x.z, x.w);
      *reinterpret_cast<uint2*>(&staged[r * kStagedStride + 4 * v]) = packed;
    }
    __syncthreads();
    for (int kb = 32 * kBlocksPerStep * part; kb < length; kb += 32 * kBlocksPerStep * kSplit) {
      uint4 w_low[kBlocksPerStep], w_high[kBlocksPerStep];
#pragma unroll
      for (int b = 0; b < kBlocksPerStep; ++b) {
        const int k = kb + 32 * b + 8 * t;  // this lane's 8 values of block b
        const bool in_range = k < length;   // whole 8-value segments: length % 8 == 0
        w_low[b] =
            in_range && low_valid ? __ldg(reinterpret_cast<const uint4*>(low + k0 + k)) : zero;
        w_high[b] =
            in_range && high_valid ? __ldg(reinterpret_cast<const uint4*>(high + k0 + k)) : zero;
      }
#pragma unroll
      for (int b = 0; b < kBlocksPerStep; ++b) {
        const int k = kb + 32 * b + 8 * t;
        if (kb + 32 * b >= length) break;  // uniform: the chunk's last block was done
        const uint32_t step0[4] = {w_low[b].x, w_high[b].x, w_low[b].y, w_high[b].y};
        const uint32_t step1[4] = {w_low[b].z, w_high[b].z, w_low[b].w, w_high[b].w};
#pragma unroll
        for (int q = 0; q < kColumnGroups; ++q) {
          if (q >= groups) break;
          // B column g of group q is tile row 8q + g.
          const uint4 x =
              k < length ? *reinterpret_cast<const uint4*>(&staged[(8 * q + g) * kStagedStride + k])
                         : zero;
          mma_bf16_16x8x16(c[q], step0, x.x, x.y);
          mma_bf16_16x8x16(c[q], step1, x.z, x.w);
        }
      }
    }
  }

  if constexpr (kSplit > 1) {
    // The parts' sums go through the staging space.
    static_assert((kSplit - 1) * kWarps * kColumnGroups * 4 * 32 * 4 <= sizeof(staged));
    __syncthreads();  // every part is done with the staged inputs
    if (!sum_split_parts<kSplit, kWarps, kColumnGroups>(c, reinterpret_cast<float*>(staged), part,
                                                        warp, lane))
      return;
  }

#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 8 * q + 2 * t + i;  // tile row of c[q][i] and c[q][2 + i]
      if (row >= m) continue;
      const int position = start + row;
      if constexpr (kGateUp) {
        const float gate = c[q][i], up = c[q][2 + i];
        // silu(gate) * up, the expression of elementwise_ops' silu_mul.
        if (low_valid)
          a.output[static_cast<int64_t>(position) * a.neurons + low_row] =
              gate / (1.0f + expf(-gate)) * up;
      } else {
        const int64_t pair = a.pair_of[position];
        if (low_valid) a.output[pair * a.neurons + low_row] = c[q][i];
        if (high_valid) a.output[pair * a.neurons + high_row] = c[q][2 + i];
      }
    }
  }
}

// Four warps along k per weight-row warp on small grids (expert_split_k);
// MEGACTX_BF16_EXPERT_SPLIT_K=1 or 4 forces it off or on.
bool split_k(const dim3& grid, bool batch_invariant) {
  static const int forced = expert_split_from_env("MEGACTX_BF16_EXPERT_SPLIT_K", 4);
  return expert_split_k(forced, static_cast<int64_t>(grid.x) * grid.y, batch_invariant);
}

template <bool kGateUp>
void launch(const ExpertArgs& args, int64_t max_tiles, cudaStream_t stream) {
  constexpr int64_t kNeuronsPerCta = kWarps * (kGateUp ? 8 : 16);
  const dim3 grid(static_cast<unsigned>((args.neurons + kNeuronsPerCta - 1) / kNeuronsPerCta),
                  static_cast<unsigned>(max_tiles));
  if (split_k(grid, args.batch_invariant))
    launch_kernel(expert_mma_kernel<kGateUp, 4>, grid, 32 * kWarps * 4, 0, stream, args);
  else
    launch_kernel(expert_mma_kernel<kGateUp, 1>, grid, 32 * kWarps, 0, stream, args);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_bf16_mma_experts(const ExpertArgs& args, bool gate_up, int64_t max_tiles,
                             cudaStream_t stream) {
  if (gate_up) {
    launch<true>(args, max_tiles, stream);
  } else {
    launch<false>(args, max_tiles, stream);
  }
}

}  // namespace megactx::cuda
