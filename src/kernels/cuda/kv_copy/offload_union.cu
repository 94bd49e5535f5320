// The union staging kernels of offload_union.h.
#include <cub/device/device_scan.cuh>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/warp_copy.cuh"
#include "kernels/cuda/kv_copy/offload_union.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Marks: one per selected offload slot (racing writes of the same 1).
__global__ void __launch_bounds__(kThreads) mark_kernel(OffloadUnionParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int32_t slot = p.slots[i];
    if (slot >= 0 && slot >= p.pool_slots) p.marks[slot - p.pool_slots] = 1;
  }
}

// After the prefix sum: the list in slot order, the marks cleared.
__global__ void __launch_bounds__(kThreads) list_kernel(OffloadUnionParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t o = int64_t{blockIdx.x} * kThreads + threadIdx.x; o < p.offload_slots;
       o += int64_t{gridDim.x} * kThreads) {
    if (p.marks[o] == 0) continue;
    p.marks[o] = 0;
    const int64_t row = p.positions[o] - 1;
    if (row < p.capacity) p.list[row] = static_cast<int32_t>(o);
  }
}

// Rewrite: every selected offload slot to its row, or past the staging
// (read from host memory) when the union outgrew it.
__global__ void __launch_bounds__(kThreads) rewrite_kernel(OffloadUnionParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int32_t slot = p.slots[i];
    if (slot < 0 || slot < p.pool_slots) {
      p.staged_slots[i] = slot;
      continue;
    }
    const int64_t o = slot - p.pool_slots;
    const int64_t row = p.positions[o] - 1;
    p.staged_slots[i] =
        static_cast<int32_t>(p.pool_slots + (row < p.capacity ? row : p.capacity + o));
  }
}

// Per layer: the union's rows, kRowsPerWarp in flight per warp.
constexpr int kRowsPerWarp = 4;

__global__ void __launch_bounds__(kThreads) copy_kernel(OffloadUnionCopyParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t rows = min(static_cast<int64_t>(*p.count), p.capacity);
  warp_copy_rows<kRowsPerWarp>(rows, p.entry_bytes, [&](int64_t row) {
    return RowRoute{
        reinterpret_cast<const uint4*>(p.offload_pool + int64_t{p.list[row]} * p.entry_bytes),
        reinterpret_cast<uint4*>(p.staging + row * p.entry_bytes)};
  });
}

}  // namespace

namespace detail {

size_t offload_union_scan_bytes(int64_t offload_slots) {
  size_t bytes = 0;
  MEGACTX_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr),
                                                   static_cast<int>(offload_slots)));
  return bytes;
}

void launch_mark_offload_union(const OffloadUnionParams& p, cudaStream_t stream) {
  launch_kernel(mark_kernel, dim3(grid_blocks(p.entries, kThreads)), dim3(kThreads), 0, stream, p);
}

void launch_list_offload_union(const OffloadUnionParams& p, cudaStream_t stream) {
  size_t bytes = p.scan_bytes;
  MEGACTX_CUDA_CHECK(cub::DeviceScan::InclusiveSum(p.scan_storage, bytes, p.marks, p.positions,
                                                   static_cast<int>(p.offload_slots), stream));
  launch_kernel(list_kernel, dim3(grid_blocks(p.offload_slots, kThreads)), dim3(kThreads), 0,
                stream, p);
}

void launch_rewrite_offload_union(const OffloadUnionParams& p, cudaStream_t stream) {
  launch_kernel(rewrite_kernel, dim3(grid_blocks(p.entries, kThreads)), dim3(kThreads), 0, stream,
                p);
}

void launch_copy_offload_union(const OffloadUnionCopyParams& p, cudaStream_t stream) {
  // The count is on the device: a grid for the whole capacity, at most 4096
  // blocks (32K warps, 128K rows in flight), which the bus saturates long before.
  launch_kernel(copy_kernel, dim3(grid_blocks(p.capacity, int64_t{kWarps} * kRowsPerWarp)),
                dim3(kThreads), 0, stream, p);
}

}  // namespace detail
}  // namespace megactx::cuda
