// fp8 routed experts (e4m3 weights with 128x128 block scales, as an fp8
// checkpoint ships them) on the grouped device path, on tensor cores: the
// grouped expert kernel of grouped_experts.cu with each warp's weight rows as
// the M of mma.sync m16n8k32 and the tile's up to kGroupedMoeTileRowsFp8 = 32
// rows its N (gemm/fp8_weight_rows_mma.cuh), so the rows of a batch (batched
// decode, MTP verification) cost no extra weight traffic. The inputs (x rows
// for gate_up, the SwiGLU activations for down) arrive quantised per 1x128
// group by quantize_e4m3_groups, exactly as Blas::linear_fp8 quantises them
// for the host dispatch; each 128-column group's MMA sums are promoted to
// float32 times both scales, as the dense fp8 tensor-core kernels do.
//
// Grid (neuron blocks, max_tiles). A CTA takes one tile (one expert, up to 32
// of its pairs); each of its 4 warps takes 16 weight rows: gate_up 8 neurons
// (gate rows j and up rows I + j, so SwiGLU is applied in registers), down
// 16 neurons. Input rows are read straight from global memory (L1 / L2 hits:
// every warp of the tile reads them), weights once per tile.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/gemm/fp8_weight_rows_mma.cuh"
#include "kernels/cuda/moe/expert_kernels.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "kernels/cuda/moe/split_k_parts.cuh"

namespace megactx::cuda {
namespace {

constexpr int kWarps = 4;  // weight-row warps per CTA (each times kSplit along k)
constexpr int kTileRows = static_cast<int>(kGroupedMoeTileRowsFp8);
constexpr int kColumnGroups = kTileRows / 8;

static_assert(kTileRows % 8 == 0, "tile rows come in n = 8 MMA column groups");

// One tile's product with kGroups column groups of 8 tile rows (m <= 8 *
// kGroups): fewer groups leave registers for more weight groups in flight
// (kFp8GroupsInFlight: 4 at up to 16 rows, 2 at 32), and a tile of few rows
// is bound by the memory round trip per group, not by its MMAs.
// kSplit > 1: the CTA's kSplit parts (of kWarps warps each) take contiguous
// shares of the 128-column groups, and part 0 adds the others' sums in part
// order from `partial` ([kSplit - 1][kWarps][kGroups * 4][32] floats).
template <bool kGateUp, int kGroups, int kSplit>
__device__ __forceinline__ void expert_fp8_tile(const ExpertArgs& a, const int64_t* source,
                                                int expert, int start, int m, float* partial) {
  const int warp = static_cast<int>(threadIdx.x) / 32 % kWarps,
            lane = static_cast<int>(threadIdx.x) % 32;
  const int part = static_cast<int>(threadIdx.x) / (32 * kWarps);
  const int gq = lane / 4, t = lane % 4;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * (kGateUp ? 8 : 16);
  const int64_t low_row = first + gq;
  const int64_t high_row = kGateUp ? a.neurons + first + gq : first + gq + 8;
  const bool low_valid = low_row < a.neurons;
  const bool high_valid = kGateUp ? low_valid : high_row < a.neurons;
  const int64_t groups = (a.in + kFp8MmaGroup - 1) / kFp8MmaGroup;
  const int64_t weight_rows = kGateUp ? 2 * a.neurons : a.neurons;
  const uint8_t* expert_weights =
      static_cast<const uint8_t*>(a.weights) + static_cast<int64_t>(expert) * weight_rows * a.in;
  const float* expert_scales =
      a.weight_scale + static_cast<int64_t>(expert) * a.weight_scale_rows * groups;

  Fp8WeightRows<kGroups> rows;
  rows.in = a.in;
  if (low_valid) {
    rows.low = expert_weights + low_row * a.in;
    rows.low_scale = expert_scales + fp8_scale_row(low_row, a.scale_split) * groups;
  }
  if (high_valid) {
    rows.high = expert_weights + high_row * a.in;
    rows.high_scale = expert_scales + fp8_scale_row(high_row, a.scale_split) * groups;
  }
  rows.active_groups = (m + 7) / 8;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    if (8 * q + gq < m) rows.input[q] = a.input_q + source[8 * q + gq] * a.in;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int held = 8 * q + 2 * t + i;
      if (held < m) rows.input_scale[q][i] = a.input_scale + source[held] * groups;
    }
  }

  float acc[kGroups][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[q][e] = 0.0f;
  fp8_weight_rows_mma(rows, groups * part / kSplit, groups * (part + 1) / kSplit, acc);
  if constexpr (kSplit > 1) {
    // m, and so kGroups, is uniform over the CTA: every thread gets here.
    if (!sum_split_parts<kSplit, kWarps, kGroups>(acc, partial, part, warp, lane)) return;
  } else {
    (void)partial;
  }

#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 8 * q + 2 * t + i;  // tile row of acc[q][i] and acc[q][2 + i]
      if (row >= m) continue;
      const int position = start + row;
      if constexpr (kGateUp) {
        const float gate = acc[q][i], up = acc[q][2 + i];
        // silu(gate) * up, the expression of elementwise_ops' silu_mul.
        if (low_valid)
          a.output[static_cast<int64_t>(position) * a.neurons + low_row] =
              gate / (1.0f + expf(-gate)) * up;
      } else {
        const int64_t pair = a.pair_of[position];
        if (low_valid) a.output[pair * a.neurons + low_row] = acc[q][i];
        if (high_valid) a.output[pair * a.neurons + high_row] = acc[q][2 + i];
      }
    }
  }
}

// kSmallTiles: tiles of up to 16 rows take the two-column-group path (four
// weight groups in flight), larger ones the four-group path (two in flight).
// glm_1b on an H100, fp8 decode steps: 3-4% faster at batches 1-32 and 2% at
// 64 (docs/benchmarks.md); a third, one-group path with six in flight for
// tiles of up to 8 rows was 8% slower at batch 16 and was dropped.
// MEGACTX_FP8_EXPERT_SMALL_TILES=0: every tile on the four-group path (A/B).
// kSplit (MEGACTX_FP8_EXPERT_SPLIT_K=2; not yet run on a GPU, so off): two
// parts along k per weight-row warp, for twice the weight loads in flight
// when a launch has few CTAs (decode at batch 1); 256 threads keep the tile
// path's ~250 registers.
template <bool kGateUp, bool kSmallTiles, int kSplit>
__global__ void __launch_bounds__(32 * kWarps * kSplit) expert_fp8_mma_kernel(ExpertArgs a) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *a.tile_count) return;  // the routing left this tile empty
  const int expert = a.tiles[3 * tile];
  const int start = a.tiles[3 * tile + 1];
  const int m = a.tiles[3 * tile + 2];  // 1..kTileRows

  __shared__ int64_t source[kTileRows];  // input row (of input_q / input_scale) per tile row
  __shared__ float partial[kSplit > 1 ? (kSplit - 1) * kWarps * kColumnGroups * 4 * 32 : 1];
  if (threadIdx.x < kTileRows) {
    int64_t row = 0;
    if (static_cast<int>(threadIdx.x) < m) {
      const int position = start + static_cast<int>(threadIdx.x);
      row = kGateUp ? a.pair_of[position] / a.top_k : position;
    }
    source[threadIdx.x] = row;
  }
  __syncthreads();
  // m is uniform over the CTA. Batched decode spreads few rows over each
  // expert (glm_1b at batch 64: ~16 pairs per expert).
  if (kSmallTiles && m <= 16) {
    expert_fp8_tile<kGateUp, 2, kSplit>(a, source, expert, start, m, partial);
  } else {
    expert_fp8_tile<kGateUp, kColumnGroups, kSplit>(a, source, expert, start, m, partial);
  }
}

bool small_tiles() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_FP8_EXPERT_SMALL_TILES");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

// Two warps along k per weight-row warp on small grids (expert_split_k);
// MEGACTX_FP8_EXPERT_SPLIT_K=1 or 2 forces it off or on.
bool split_k(const dim3& grid, bool batch_invariant) {
  static const int forced = expert_split_from_env("MEGACTX_FP8_EXPERT_SPLIT_K", 2);
  return expert_split_k(forced, static_cast<int64_t>(grid.x) * grid.y, batch_invariant);
}

template <bool kGateUp>
void launch(const ExpertArgs& args, int64_t max_tiles, cudaStream_t stream) {
  constexpr int64_t kNeuronsPerCta = kWarps * (kGateUp ? 8 : 16);
  const dim3 grid(static_cast<unsigned>((args.neurons + kNeuronsPerCta - 1) / kNeuronsPerCta),
                  static_cast<unsigned>(max_tiles));
  constexpr int kThreads = 32 * kWarps;
  if (small_tiles() && split_k(grid, args.batch_invariant))
    launch_kernel(expert_fp8_mma_kernel<kGateUp, true, 2>, grid, 2 * kThreads, 0, stream, args);
  else if (small_tiles())
    launch_kernel(expert_fp8_mma_kernel<kGateUp, true, 1>, grid, kThreads, 0, stream, args);
  else
    launch_kernel(expert_fp8_mma_kernel<kGateUp, false, 1>, grid, kThreads, 0, stream, args);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_fp8_experts(const ExpertArgs& args, bool gate_up, int64_t max_tiles,
                        cudaStream_t stream) {
  if (gate_up) {
    launch<true>(args, max_tiles, stream);
  } else {
    launch<false>(args, max_tiles, stream);
  }
}

}  // namespace megactx::cuda
