// Argument checks of the staging copy (stage_offload.h); the kernel is in
// stage_offload.cu.
#include "kernels/cuda/kv_copy/stage_offload.h"

#include <cstdint>

#include "core/error.h"

namespace megactx::cuda {

namespace detail {
void launch_stage_offload(const StageOffloadParams& params, cudaStream_t stream);
}  // namespace detail

void stage_offload_entries(const StageOffloadParams& p, cudaStream_t stream) {
  if (p.entries == 0) return;
  MEGACTX_CHECK(p.slots && p.staged_slots && p.offload_pool && p.staging,
                "stage_offload_entries: a required pointer is null");
  // Two 16-byte words per lane of a warp.
  MEGACTX_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0 && p.entry_bytes <= 64 * 16,
                "stage_offload_entries: entries of {} bytes", p.entry_bytes);
  MEGACTX_CHECK(p.entries > 0 && p.pool_slots >= 0 && p.pool_slots + p.entries <= INT32_MAX,
                "stage_offload_entries: staged slots past int32");
  detail::launch_stage_offload(p, stream);
}

}  // namespace megactx::cuda
