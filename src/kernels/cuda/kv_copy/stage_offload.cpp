// Argument checks of the staging and hot cache launches (stage_offload.h);
// the kernels are in stage_offload.cu.
#include "kernels/cuda/kv_copy/stage_offload.h"

#include <cstdint>

#include "core/error.h"

namespace megactx::cuda {

namespace detail {
void launch_assign_offload(const StageOffloadParams& params, cudaStream_t stream);
void launch_stage_offload(const StageOffloadParams& params, cudaStream_t stream);
void launch_invalidate_offload(const InvalidateOffloadParams& params, cudaStream_t stream);
}  // namespace detail

namespace {

void check(const StageOffloadParams& p) {
  MEGACTX_CHECK(p.slots && p.staged_slots && p.offload_pool && p.staging,
                "offload staging: a required pointer is null");
  MEGACTX_CHECK(p.lines == 0 || (p.tags && p.claims && p.hits && p.copy),
                "offload staging: a hot cache without its tables");
  // Two 16-byte words per lane of a warp.
  MEGACTX_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0 && p.entry_bytes <= 64 * 16,
                "offload staging: entries of {} bytes", p.entry_bytes);
  MEGACTX_CHECK(p.entries > 0 && p.lines >= 0 && p.pool_slots >= 0 &&
                    p.pool_slots + p.lines + p.entries <= INT32_MAX,
                "offload staging: staged slots past int32");
}

}  // namespace

void assign_offload_entries(const StageOffloadParams& p, cudaStream_t stream) {
  if (p.entries == 0) return;
  check(p);
  detail::launch_assign_offload(p, stream);
}

void stage_offload_entries(const StageOffloadParams& p, cudaStream_t stream) {
  if (p.entries == 0) return;
  check(p);
  MEGACTX_CHECK(p.lines == 0 || p.hot_pool, "offload staging: no hot pool for this layer");
  detail::launch_stage_offload(p, stream);
}

void invalidate_offload_lines(const InvalidateOffloadParams& p, cudaStream_t stream) {
  if (p.count == 0) return;
  MEGACTX_CHECK(p.tags && p.lines > 0 && p.page_size > 0 && p.count > 0 &&
                    p.count <= kInvalidatePagesPerLaunch,
                "invalidate_offload_lines: bad arguments");
  detail::launch_invalidate_offload(p, stream);
}

}  // namespace megactx::cuda
