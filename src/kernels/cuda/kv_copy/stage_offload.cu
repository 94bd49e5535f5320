// The staging copy of stage_offload.h.
#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/kv_copy/stage_offload.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// A warp per entry: lane l copies words l and l + 32 of it, both loads issued
// before either store (two bus round trips per warp in flight at once).
__global__ void __launch_bounds__(kThreads) stage_offload_kernel(StageOffloadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int lane = threadIdx.x % 32;
  const int words = p.entry_bytes / 16;
  for (int64_t i = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; i < p.entries;
       i += int64_t{gridDim.x} * kWarps) {
    const int32_t slot = p.slots[i];
    const bool offloaded = slot >= 0 && slot >= p.pool_slots;
    if (lane == 0) p.staged_slots[i] = offloaded ? static_cast<int32_t>(p.pool_slots + i) : slot;
    if (!offloaded) continue;
    const uint4* from =
        reinterpret_cast<const uint4*>(p.offload_pool + (slot - p.pool_slots) * p.entry_bytes);
    uint4* to = reinterpret_cast<uint4*>(p.staging + i * p.entry_bytes);
    uint4 first, second;
    if (lane < words) first = from[lane];
    if (lane + 32 < words) second = from[lane + 32];
    if (lane < words) to[lane] = first;
    if (lane + 32 < words) to[lane + 32] = second;
  }
}

}  // namespace

namespace detail {

void launch_stage_offload(const StageOffloadParams& p, cudaStream_t stream) {
  // Enough warps for the bus: every entry of a decode step in flight at once.
  const int64_t blocks = std::min<int64_t>((p.entries + kWarps - 1) / kWarps, 4096);
  launch_kernel(stage_offload_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                stream, p);
}

}  // namespace detail

}  // namespace megactx::cuda
