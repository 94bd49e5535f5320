// Copies of fixed-size rows (the 656-byte latent entries of the live host
// tier) with many rows in flight per warp, for copies whose source is host
// memory over PCIe: the bus needs tens of thousands of outstanding 16-byte
// loads to reach its bandwidth, so every load of a warp's rows is issued
// before the first store. Shared by kv_copy/stage_offload.cu and
// kv_copy/offload_union.cu. Only for .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace megactx::cuda {

// A grid of ceil(items / per_block) blocks, at least 1 and at most `cap`
// (the kernels stride over the rest).
inline unsigned grid_blocks(int64_t items, int64_t per_block, int64_t cap = 4096) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, cap)));
}

// Where a row goes: `to` null when row i is not copied by this launch.
struct RowRoute {
  const uint4* from = nullptr;
  uint4* to = nullptr;
};

// A warp per row, kInFlight rows in flight per warp: lane l copies 16-byte
// words l and l + 32 of each (rows of at most 1024 bytes, a multiple of 16).
// route(i) -> RowRoute for rows 0..count-1. Every warp of the grid calls it;
// returns the rows this warp copied (the same on every lane).
template <int kInFlight, typename Route>
__device__ __forceinline__ unsigned warp_copy_rows(int64_t count, int row_bytes, Route route) {
  const int lane = threadIdx.x % 32;
  const int words = row_bytes / 16;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  unsigned copied = 0;
  for (int64_t base = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; base < count;
       base += warps * kInFlight) {
    uint4 first[kInFlight], second[kInFlight];
    uint4* to[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int64_t i = base + k * warps;
      to[k] = nullptr;
      if (i >= count) continue;
      const RowRoute r = route(i);
      to[k] = r.to;
      if (r.to == nullptr) continue;
      if (lane < words) first[k] = r.from[lane];
      if (lane + 32 < words) second[k] = r.from[lane + 32];
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (to[k] == nullptr) continue;
      if (lane < words) to[k][lane] = first[k];
      if (lane + 32 < words) to[k][lane + 32] = second[k];
      ++copied;
    }
  }
  return copied;
}

}  // namespace megactx::cuda
