// The kernels of gather_entries.h.
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/warp_copy.cuh"
#include "kernels/cuda/kv_copy/gather_entries.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// A warp per entry: lane l copies 16-byte words l, l + 32, ... of it
// (device memory both ways: no need for many entries in flight per warp).
__device__ __forceinline__ void copy_entry(const uint8_t* from, uint8_t* to, int entry_bytes) {
  const int words = entry_bytes / 16;
  const auto* source = reinterpret_cast<const uint4*>(from);
  auto* target = reinterpret_cast<uint4*>(to);
  for (int w = static_cast<int>(threadIdx.x % 32); w < words; w += 32) target[w] = source[w];
}

__global__ void __launch_bounds__(kThreads) gather_kernel(GatherEntriesParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads)
    p.dense_slots[i] = p.slots[i] >= 0 ? static_cast<int32_t>(i) : -1;
  if (p.pool == nullptr) return;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t i = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; i < p.entries; i += warps) {
    const int32_t slot = p.slots[i];
    if (slot >= 0)
      copy_entry(p.pool + int64_t{slot} * p.entry_bytes, p.dense + i * p.entry_bytes,
                 p.entry_bytes);
  }
}

__global__ void __launch_bounds__(kThreads) scatter_kernel(ScatterEntriesParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t i = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; i < p.entries; i += warps) {
    const int32_t slot = p.slots[i];
    if (slot >= 0)
      copy_entry(p.dense + i * p.entry_bytes, p.pool + int64_t{slot} * p.entry_bytes,
                 p.entry_bytes);
  }
}

}  // namespace

namespace detail {

void launch_gather_entries(const GatherEntriesParams& p, cudaStream_t stream) {
  launch_kernel(gather_kernel, dim3(grid_blocks(p.entries, kWarps)), dim3(kThreads), 0, stream, p);
}

void launch_scatter_entries(const ScatterEntriesParams& p, cudaStream_t stream) {
  launch_kernel(scatter_kernel, dim3(grid_blocks(p.entries, kWarps)), dim3(kThreads), 0, stream, p);
}

}  // namespace detail
}  // namespace megactx::cuda
