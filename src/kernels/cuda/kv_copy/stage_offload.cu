// The staging and hot cache kernels of stage_offload.h.
#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/warp_copy.cuh"
#include "kernels/cuda/kv_copy/stage_offload.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// A staged slot of pass 1 for a miss that passes 2 and 3 resolve.
constexpr int32_t kMissPending = -2;

__device__ __forceinline__ bool offloaded(const StageOffloadParams& p, int32_t slot) {
  return slot >= 0 && slot >= p.pool_slots;
}

// An offload slot's line (StageOffloadParams or InvalidateOffloadParams; the
// map is described in stage_offload.h): consecutive slots on consecutive
// lines, each cycle of `lines` slots rotated by its hash (cycle 0 by none).
template <typename Params>
__device__ __forceinline__ int64_t hot_line(const Params& p, int64_t slot) {
  const int64_t offset = slot - p.pool_slots;
  if (p.line_map == OffloadLineMap::kModulo) return offset % p.lines;
  const auto cycle = static_cast<uint32_t>(offset / p.lines);
  return (offset % p.lines + (cycle == 0 ? 0 : hash_mix(cycle))) % p.lines;
}

// Adds a thread's count to a counter: one atomic per warp. Every lane of the
// warp calls it (after the grid-stride loops, where the warp has converged).
__device__ __forceinline__ void count_warp(unsigned long long* counter, unsigned count) {
  count = __reduce_add_sync(0xffffffffU, count);
  if (threadIdx.x % 32 == 0 && count > 0)
    atomicAdd(counter, static_cast<unsigned long long>(count));
}

// Without a hot cache: every offload entry to its staging row.
__global__ void __launch_bounds__(kThreads) assign_rows_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  unsigned selected = 0;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int32_t slot = p.slots[i];
    selected += offloaded(p, slot);
    p.staged_slots[i] = offloaded(p, slot) ? static_cast<int32_t>(p.pool_slots + i) : slot;
  }
  if (p.counters != nullptr) {
    count_warp(&p.counters->selected, selected);
    if (p.count_step && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&p.counters->steps, 1ULL);
  }
}

// Pass 1: hits read their line (and mark it: no miss takes it this step).
__global__ void __launch_bounds__(kThreads) assign_hits_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  unsigned selected = 0, hits = 0;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int32_t slot = p.slots[i];
    p.copy[i] = 0;
    if (!offloaded(p, slot)) {
      p.staged_slots[i] = slot;
      continue;
    }
    ++selected;
    const int64_t line = hot_line(p, slot);
    if (p.tags[line] == slot) {
      ++hits;
      p.hits[line] = 1;
      p.staged_slots[i] = static_cast<int32_t>(p.pool_slots + line);
    } else {
      p.staged_slots[i] = kMissPending;
    }
  }
  if (p.counters != nullptr) {
    count_warp(&p.counters->selected, selected);
    count_warp(&p.counters->hot_hits, hits);
    if (p.count_step && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&p.counters->steps, 1ULL);
  }
}

// Pass 2: a miss claims its line unless a hit holds it; one winner per line
// (the lowest entry), which copies; another miss of the same slot reads the
// winner's line; the others take their staging row.
__global__ void __launch_bounds__(kThreads) assign_misses_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    if (p.staged_slots[i] != kMissPending) continue;
    const int32_t slot = p.slots[i];
    const int64_t line = hot_line(p, slot);
    if (p.hits[line] == 0) atomicMin(&p.claims[line], static_cast<int32_t>(i));
  }
}

// Pass 3: winners take the line (tag, copy flag), same-slot losers read it,
// the rest their staging row.
__global__ void __launch_bounds__(kThreads) assign_winners_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    if (p.staged_slots[i] != kMissPending) continue;
    const int32_t slot = p.slots[i];
    const int64_t line = hot_line(p, slot);
    const int32_t winner = p.hits[line] == 0 ? p.claims[line] : -1;
    if (winner == static_cast<int32_t>(i)) {
      p.tags[line] = slot;
      p.copy[i] = 1;
      p.staged_slots[i] = static_cast<int32_t>(p.pool_slots + line);
    } else if (winner >= 0 && p.slots[winner] == slot) {
      p.staged_slots[i] = static_cast<int32_t>(p.pool_slots + line);
    } else {
      p.staged_slots[i] = static_cast<int32_t>(p.pool_slots + p.lines + i);
    }
  }
}

// Pass 4: the per-step marks back to their resting values.
__global__ void __launch_bounds__(kThreads) assign_reset_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int32_t slot = p.slots[i];
    if (!offloaded(p, slot)) continue;
    const int64_t line = hot_line(p, slot);
    p.hits[line] = 0;
    p.claims[line] = 0x7fffffff;
  }
}

// Where entry i goes in this launch (null: nowhere: not an offload entry, a
// hit, a same-slot miss the winner copies, or a copy another launch makes).
__device__ __forceinline__ uint8_t* stage_destination(const StageOffloadParams& p, int64_t i,
                                                      int32_t slot) {
  if (!offloaded(p, slot)) return nullptr;
  const int32_t staged = p.staged_slots[i];
  const int64_t rows_begin = p.pool_slots + p.lines;
  if (staged >= rows_begin) {
    if (p.copies == OffloadCopies::kLines) return nullptr;
    return p.staging + (staged - rows_begin) * p.entry_bytes;
  }
  if (p.lines > 0 && p.copy[i] && p.copies != OffloadCopies::kRows)
    return p.hot_pool + (staged - p.pool_slots) * p.entry_bytes;
  return nullptr;
}

// kEntriesPerWarp entries in flight per warp, so that a small grid (the side
// stream's fills, max_blocks) still keeps enough bytes on the bus.
constexpr int kEntriesPerWarp = 4;

__global__ void __launch_bounds__(kThreads) stage_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const unsigned copied = warp_copy_rows<kEntriesPerWarp>(p.entries, p.entry_bytes, [&](int64_t i) {
    const int32_t slot = p.slots[i];
    uint8_t* to = stage_destination(p, i, slot);
    if (to == nullptr) return RowRoute{};
    return RowRoute{
        reinterpret_cast<const uint4*>(p.offload_pool + (slot - p.pool_slots) * p.entry_bytes),
        reinterpret_cast<uint4*>(to)};
  });
  // Counted once per warp (lane 0).
  if (p.counters != nullptr)
    count_warp(&p.counters->copied_entries, threadIdx.x % 32 == 0 ? copied : 0);
}

__global__ void __launch_bounds__(kThreads) invalidate_kernel(InvalidateOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t total = int64_t{p.count} * p.page_size;
  for (int64_t k = int64_t{blockIdx.x} * kThreads + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * kThreads) {
    const int64_t slot = int64_t{p.pages[k / p.page_size]} * p.page_size + k % p.page_size;
    const int64_t line = hot_line(p, slot);
    if (p.tags[line] == slot) p.tags[line] = -1;
  }
}

}  // namespace

namespace detail {

void launch_assign_offload(const StageOffloadParams& p, cudaStream_t stream) {
  const dim3 grid(grid_blocks(p.entries, kThreads)), block(kThreads);
  if (p.lines == 0) {
    launch_kernel(assign_rows_kernel, grid, block, 0, stream, p);
    return;
  }
  launch_kernel(assign_hits_kernel, grid, block, 0, stream, p);
  launch_kernel(assign_misses_kernel, grid, block, 0, stream, p);
  launch_kernel(assign_winners_kernel, grid, block, 0, stream, p);
  launch_kernel(assign_reset_kernel, grid, block, 0, stream, p);
}

void launch_stage_offload(const StageOffloadParams& p, cudaStream_t stream) {
  // Enough warps for the bus: every entry of a decode step in flight at once,
  // unless the launch is capped (StageOffloadParams::max_blocks).
  unsigned blocks = grid_blocks(p.entries, int64_t{kWarps} * kEntriesPerWarp);
  if (p.max_blocks > 0) blocks = std::min(blocks, static_cast<unsigned>(p.max_blocks));
  launch_kernel(stage_kernel, dim3(blocks), dim3(kThreads), 0, stream, p);
}

void launch_invalidate_offload(const InvalidateOffloadParams& p, cudaStream_t stream) {
  launch_kernel(invalidate_kernel, dim3(grid_blocks(int64_t{p.count} * p.page_size, kThreads)),
                dim3(kThreads), 0, stream, p);
}

}  // namespace detail
}  // namespace megactx::cuda
