// The kernel of gather_entries.h.
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/warp_copy.cuh"
#include "kernels/cuda/kv_copy/gather_entries.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 4;  // entries in flight per warp

__global__ void __launch_bounds__(kThreads) gather_kernel(GatherEntriesParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < p.entries;
       i += int64_t{gridDim.x} * kThreads)
    p.dense_slots[i] = p.slots[i] >= 0 ? static_cast<int32_t>(i) : -1;
  if (p.pool == nullptr) return;
  warp_copy_rows<kRowsPerWarp>(p.entries, p.entry_bytes, [&](int64_t i) {
    const int32_t slot = p.slots[i];
    if (slot < 0) return RowRoute{};
    return RowRoute{reinterpret_cast<const uint4*>(p.pool + int64_t{slot} * p.entry_bytes),
                    reinterpret_cast<uint4*>(p.dense + i * p.entry_bytes)};
  });
}

}  // namespace

namespace detail {

void launch_gather_entries(const GatherEntriesParams& p, cudaStream_t stream) {
  launch_kernel(gather_kernel, dim3(grid_blocks(p.entries, int64_t{kWarps} * kRowsPerWarp)),
                dim3(kThreads), 0, stream, p);
}

}  // namespace detail
}  // namespace megactx::cuda
