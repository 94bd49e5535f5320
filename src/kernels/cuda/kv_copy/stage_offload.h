// The live host tier's staging copy: before a layer's sparse MLA, the
// selected entries that live in host memory (offload pages, cache/kv_cache.h)
// are copied into a device staging buffer by one kernel with many 16-byte
// loads in flight, and the attention reads them from there. Reading them
// straight from host memory inside the attention kernel (the fallback when a
// step selects more entries than the staging holds) is latency-bound: on the
// H200 the cluster kernel took 2.3x the all-device time per decode step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct StageOffloadParams {
  const int32_t* slots = nullptr;         // [entries] physical slots, -1 = none
  int32_t* staged_slots = nullptr;        // [entries] out: slots[i], or pool_slots + i when staged
  int64_t entries = 0;                    // rows x top-k (at most the staging's capacity)
  int64_t pool_slots = 0;                 // slots from here on are offload slots
  const uint8_t* offload_pool = nullptr;  // [offload slots, entry_bytes] pinned host memory
  uint8_t* staging = nullptr;             // [entries, entry_bytes] device
  int entry_bytes = 0;                    // a multiple of 16 (656: the fp8 latent entry)
};

// Entry i whose slot is an offload slot is copied to staging[i] and its
// staged slot becomes pool_slots + i (read with offload_pool = staging);
// device slots pass through. One launch on `stream`, no host sync.
void stage_offload_entries(const StageOffloadParams& params, cudaStream_t stream);

}  // namespace megactx::cuda
