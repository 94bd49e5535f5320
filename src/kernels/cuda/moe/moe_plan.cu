// (a) of the grouped MoE path: bucket the routed (row, slot) pairs by expert
// on the device, in one thread block. Stable (pairs keep their order within
// an expert) without an O(pairs^2) scan: a warp ranks its equal ids with
// __match_any_sync, per-(warp, expert) counts give each warp its base, and
// chunks of up to 512 pairs run one after another. Tiles of up to
// shape.tile_rows() pairs of one expert are listed for the expert kernels.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/moe/grouped_moe.h"

namespace megactx::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

struct PlanArgs {
  const int32_t* ids = nullptr;  // [pairs] routed expert per (row, slot)
  int pairs = 0, experts = 0, tile_rows = 0;
  int32_t* tile_count = nullptr;  // [1]
  int32_t* tiles = nullptr;       // [max_tiles, 3] (expert, first bucket position, rows)
  int32_t* pair_of = nullptr;     // [pairs] bucket position -> pair
  int32_t* counts = nullptr;      // [E]
  int32_t* offsets = nullptr;     // [E + 1]
};

// blockDim.x = min(pairs rounded up to a warp, kPlanThreads); the pairs are
// ranked in chunks of blockDim.x. Dynamic shared: (5 + warps) * E int32
// (grouped_moe_layout's plan_shared_bytes).
__global__ void plan_kernel(PlanArgs a) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ int32_t shared[];
  const int experts = a.experts;
  const int threads = static_cast<int>(blockDim.x), warps = threads / 32;
  int32_t* count = shared;                  // [E] pairs per expert
  int32_t* offset = count + experts;        // [E] first bucket position
  int32_t* tile_offset = offset + experts;  // [E] first tile
  int32_t* placed = tile_offset + experts;  // [E] pairs placed by earlier chunks
  int32_t* in_chunk = placed + experts;     // [E] pairs of the current chunk
  int32_t* warp_base = in_chunk + experts;  // [warps, E] counts, then prefix over warps
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;

  // Counts per expert (order-free, so shared atomics are deterministic).
  for (int e = tid; e < experts; e += threads) {
    count[e] = 0;
    placed[e] = 0;
  }
  __syncthreads();
  for (int p = tid; p < a.pairs; p += threads) {
    const int e = a.ids[p];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // Exclusive scans over experts of the pair counts and the tile counts,
  // 32 experts per step with warp shuffles.
  if (warp == 0) {
    int pair_carry = 0, tile_carry = 0;
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane;
      const int c = e < experts ? count[e] : 0;
      const int t = (c + a.tile_rows - 1) / a.tile_rows;
      int c_sum = c, t_sum = t;
      for (int d = 1; d < 32; d <<= 1) {
        const int c_up = __shfl_up_sync(kFullMask, c_sum, d);
        const int t_up = __shfl_up_sync(kFullMask, t_sum, d);
        if (lane >= d) {
          c_sum += c_up;
          t_sum += t_up;
        }
      }
      if (e < experts) {
        offset[e] = pair_carry + c_sum - c;
        tile_offset[e] = tile_carry + t_sum - t;
      }
      pair_carry += __shfl_sync(kFullMask, c_sum, 31);
      tile_carry += __shfl_sync(kFullMask, t_sum, 31);
    }
    if (lane == 0) {
      *a.tile_count = tile_carry;
      a.offsets[experts] = pair_carry;
    }
  }
  __syncthreads();

  // Stable placement, one chunk of `threads` pairs at a time: rank among the
  // warp's equal ids, plus the earlier warps' and earlier chunks' counts.
  for (int base = 0; base < a.pairs; base += threads) {
    for (int i = tid; i < warps * experts; i += threads) warp_base[i] = 0;
    __syncthreads();
    const int pair = base + tid;
    const int expert = pair < a.pairs ? a.ids[pair] : -1;
    const bool valid = expert >= 0 && expert < experts;
    // Lanes holding the same id (invalid lanes group under -1 and are ignored).
    const unsigned same = __match_any_sync(kFullMask, valid ? expert : -1);
    const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
    if (valid && rank_in_warp == 0) warp_base[warp * experts + expert] = __popc(same);
    __syncthreads();
    for (int e = tid; e < experts; e += threads) {
      int sum = 0;
      for (int w = 0; w < warps; ++w) {
        const int c = warp_base[w * experts + e];
        warp_base[w * experts + e] = sum;
        sum += c;
      }
      in_chunk[e] = sum;
    }
    __syncthreads();
    if (valid) {
      a.pair_of[offset[expert] + placed[expert] + warp_base[warp * experts + expert] +
                rank_in_warp] = pair;
    }
    __syncthreads();
    for (int e = tid; e < experts; e += threads) placed[e] += in_chunk[e];
    // The next chunk's first barrier orders these before their next reads.
  }

  for (int e = tid; e < experts; e += threads) {
    const int c = count[e];
    a.counts[e] = c;
    a.offsets[e] = offset[e];
    for (int t = 0; t * a.tile_rows < c; ++t) {
      int32_t* tile = a.tiles + 3 * (tile_offset[e] + t);
      tile[0] = e;
      tile[1] = offset[e] + t * a.tile_rows;
      tile[2] = min(a.tile_rows, c - t * a.tile_rows);
    }
  }
}

}  // namespace

void grouped_moe_plan(const int32_t* ids, const GroupedMoeShape& shape, int32_t* plan,
                      cudaStream_t stream) {
  const GroupedMoeLayout layout = grouped_moe_layout(shape);
  PlanArgs args;
  args.ids = ids;
  args.pairs = static_cast<int>(shape.pairs());
  args.experts = static_cast<int>(shape.experts);
  args.tile_rows = static_cast<int>(shape.tile_rows());
  args.tile_count = plan + layout.tile_count;
  args.tiles = plan + layout.tiles;
  args.pair_of = plan + layout.pair_of;
  args.counts = plan + layout.counts;
  args.offsets = plan + layout.offsets;
  launch_kernel(plan_kernel, 1, static_cast<unsigned>(layout.plan_threads),
                layout.plan_shared_bytes, stream, args);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
