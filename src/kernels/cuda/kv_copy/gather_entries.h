// LayerSplit's exchange of only what a step reads (model/cuda/dsa_layer_split.cpp):
// the owner of a layer's latent pool copies the entries the step's rows
// selected into one dense buffer [entries, entry_bytes] (entry i = row
// i / top_k's selection i % top_k), which it then broadcasts; every rank
// (owner or not) makes the slots the attention reads from that buffer: entry
// i for a selected slot, -1 where the selection has none. A decode row of
// GLM-5.2 selects 2,048 entries (1.3 MB in fp8) of a context that may hold a
// million (656 MB per layer).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct GatherEntriesParams {
  const int32_t* slots = nullptr;  // [entries] physical slots of the pool, -1 = none
  int64_t entries = 0;
  int32_t* dense_slots = nullptr;  // [entries] out: i where slots[i] >= 0, else -1
  // The owner's pool [slots, entry_bytes] and the dense buffer
  // [entries, entry_bytes]; both null on a rank that only receives.
  const uint8_t* pool = nullptr;
  uint8_t* dense = nullptr;
  int entry_bytes = 0;  // a multiple of 16, at most 1024
};

// One launch: dense_slots always, the copies when `pool` is set (entries
// without a slot are left as they are: the attention never reads them).
void gather_entries(const GatherEntriesParams& params, cudaStream_t stream);

}  // namespace megactx::cuda
