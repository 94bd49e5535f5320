// The live host tier's staging for steps with many rows (prefill chunks):
// the union of the offload entries a step selects, copied once per layer into
// device rows, instead of each row's top-k read over the bus by the attention
// kernel (a 16K-row chunk selects 32M entries, mostly the same few hundred
// thousand: read per row that is ~22 GB per layer over PCIe, as a union at
// most the request's offloaded context).
//
// Per selection (a full indexer layer; the IndexShare layers after it reuse
// its list) mark_offload_union marks the selected offload slots of each of
// the step's row blocks and list_offload_union numbers them by a prefix sum
// over the tier's offload slots and lists them in slot order; per layer
// copy_offload_union copies the listed entries of that layer's offload pool,
// once for the whole step; per row block and layer rewrite_offload_union
// turns the block's selected slots into the rows the attention reads.
// The attention (SparseMlaParams) then reads rows [pool_slots, pool_slots +
// capacity) from the union staging; a union larger than the capacity leaves
// its later entries at pool_slots + capacity + (slot - pool_slots), which
// the attention reads from the host pool itself (staging_slots, correct and
// slower).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megactx::cuda {

// What each launch reads and writes:
//   mark:    slots, entries, pool_slots, offload_slots -> marks
//   list:    marks, offload_slots, capacity, scan_* -> positions, list (marks left zero)
//   rewrite: slots, entries, pool_slots, positions, capacity -> staged_slots
struct OffloadUnionParams {
  const int32_t* slots = nullptr;   // [entries] physical slots, -1 = none
  int32_t* staged_slots = nullptr;  // [entries] what the attention reads (see above)
  int64_t entries = 0;
  int64_t pool_slots = 0;        // slots from here on are offload slots
  int64_t offload_slots = 0;     // the tier's offload slots: the length of marks and positions
  int64_t capacity = 0;          // rows of the union staging
  int32_t* marks = nullptr;      // [offload_slots] device, zero between selections
  int32_t* positions = nullptr;  // [offload_slots] device: inclusive prefix sums of the marks
  int32_t* list = nullptr;       // [capacity] out: the union's offload offsets, in order
  void* scan_storage = nullptr;  // offload_union_scan_bytes(offload_slots) bytes
  size_t scan_bytes = 0;
};

// Temporary storage of the prefix sum over `offload_slots` marks.
size_t offload_union_scan_bytes(int64_t offload_slots);

void mark_offload_union(const OffloadUnionParams& params, cudaStream_t stream);
// The union's count is positions[offload_slots - 1] afterwards (the copies
// read it on the device: no host round trip).
void list_offload_union(const OffloadUnionParams& params, cudaStream_t stream);
void rewrite_offload_union(const OffloadUnionParams& params, cudaStream_t stream);

struct OffloadUnionCopyParams {
  const int32_t* list = nullptr;   // OffloadUnionParams::list
  const int32_t* count = nullptr;  // device: the union's size (positions + offload_slots - 1)
  int64_t capacity = 0;            // rows copied at most
  const uint8_t* offload_pool = nullptr;  // [offload slots, entry_bytes] pinned host memory
  uint8_t* staging = nullptr;             // [capacity, entry_bytes] device
  int entry_bytes = 0;                    // a multiple of 16, at most 1024
};

// One layer's copy of the union's entries into its staging rows.
void copy_offload_union(const OffloadUnionCopyParams& params, cudaStream_t stream);

}  // namespace megactx::cuda
