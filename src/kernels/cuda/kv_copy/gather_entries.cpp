// Argument checks of gather_entries (gather_entries.h); the kernel is in
// gather_entries.cu.
#include "kernels/cuda/kv_copy/gather_entries.h"

#include <cstdint>

#include "core/error.h"

namespace megactx::cuda {

namespace detail {
void launch_gather_entries(const GatherEntriesParams& params, cudaStream_t stream);
void launch_scatter_entries(const ScatterEntriesParams& params, cudaStream_t stream);
}  // namespace detail

void gather_entries(const GatherEntriesParams& p, cudaStream_t stream) {
  MEGACTX_CHECK(p.slots != nullptr && p.dense_slots != nullptr,
                "gather entries: a required pointer is null");
  MEGACTX_CHECK((p.pool == nullptr) == (p.dense == nullptr),
                "gather entries: a pool without its dense buffer, or the reverse");
  // Whole 16-byte words (every latent entry's size is).
  MEGACTX_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0, "gather entries: entries of {} bytes",
                p.entry_bytes);
  MEGACTX_CHECK(p.entries >= 0 && p.entries <= INT32_MAX, "gather entries: {} entries", p.entries);
  if (p.entries == 0) return;
  detail::launch_gather_entries(p, stream);
}

void scatter_entries(const ScatterEntriesParams& p, cudaStream_t stream) {
  MEGACTX_CHECK(p.dense != nullptr && p.slots != nullptr && p.pool != nullptr,
                "scatter entries: a required pointer is null");
  MEGACTX_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0,
                "scatter entries: entries of {} bytes", p.entry_bytes);
  MEGACTX_CHECK(p.entries >= 0 && p.entries <= INT32_MAX, "scatter entries: {} entries", p.entries);
  if (p.entries == 0) return;
  detail::launch_scatter_entries(p, stream);
}

}  // namespace megactx::cuda
