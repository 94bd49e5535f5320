// Argument checks of the union staging launches (offload_union.h); the
// kernels are in offload_union.cu.
#include "kernels/cuda/kv_copy/offload_union.h"

#include <cstdint>

#include "core/error.h"

namespace megactx::cuda {

namespace detail {
size_t offload_union_scan_bytes(int64_t offload_slots);
void launch_mark_offload_union(const OffloadUnionParams& params, cudaStream_t stream);
void launch_list_offload_union(const OffloadUnionParams& params, cudaStream_t stream);
void launch_rewrite_offload_union(const OffloadUnionParams& params, cudaStream_t stream);
void launch_copy_offload_union(const OffloadUnionCopyParams& params, cudaStream_t stream);
}  // namespace detail

size_t offload_union_scan_bytes(int64_t offload_slots) {
  MEGACTX_CHECK(offload_slots > 0 && offload_slots <= INT32_MAX, "offload union: {} offload slots",
                offload_slots);
  return detail::offload_union_scan_bytes(offload_slots);
}

namespace {
void check_offsets(const OffloadUnionParams& p) {
  MEGACTX_CHECK(p.offload_slots > 0 && p.capacity > 0 && p.pool_slots >= 0 &&
                    p.pool_slots + p.capacity + p.offload_slots <= INT32_MAX,
                "offload union: staged slots past int32");
}
}  // namespace

void mark_offload_union(const OffloadUnionParams& p, cudaStream_t stream) {
  if (p.entries == 0) return;
  MEGACTX_CHECK(p.slots && p.marks, "offload union marks: a required pointer is null");
  check_offsets(p);
  detail::launch_mark_offload_union(p, stream);
}

void list_offload_union(const OffloadUnionParams& p, cudaStream_t stream) {
  MEGACTX_CHECK(p.marks && p.positions && p.list && p.scan_storage,
                "offload union list: a required pointer is null");
  check_offsets(p);
  MEGACTX_CHECK(p.scan_bytes >= offload_union_scan_bytes(p.offload_slots),
                "offload union: {} bytes of scan storage are too few", p.scan_bytes);
  detail::launch_list_offload_union(p, stream);
}

void rewrite_offload_union(const OffloadUnionParams& p, cudaStream_t stream) {
  if (p.entries == 0) return;
  MEGACTX_CHECK(p.slots && p.staged_slots && p.positions,
                "offload union rewrite: a required pointer is null");
  check_offsets(p);
  detail::launch_rewrite_offload_union(p, stream);
}

void copy_offload_union(const OffloadUnionCopyParams& p, cudaStream_t stream) {
  MEGACTX_CHECK(p.list && p.count && p.offload_pool && p.staging && p.capacity > 0,
                "offload union copy: a required pointer is null");
  // Two 16-byte words per lane of a warp.
  MEGACTX_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0 && p.entry_bytes <= 64 * 16,
                "offload union copy: entries of {} bytes", p.entry_bytes);
  detail::launch_copy_offload_union(p, stream);
}

}  // namespace megactx::cuda
