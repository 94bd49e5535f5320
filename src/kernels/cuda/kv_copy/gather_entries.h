// LayerSplit's exchange of only what a step reads (model/cuda/dsa_layer_split.cpp):
// the owner of a layer's latent pool copies the entries the step's rows
// selected into one dense buffer [entries, entry_bytes] (entry i = row
// i / top_k's selection i % top_k), which it then broadcasts; every rank
// (owner or not) makes the slots the attention reads from that buffer: entry
// i for a selected slot, -1 where the selection has none. A decode row of
// GLM-5.2 selects 2,048 entries (1.3 MB in fp8) of a context that may hold a
// million (656 MB per layer). scatter_entries is the other way: a prefill
// chunk's new rows, sent dense by the owner, into the pool a rank borrowed
// for the layer (whose old context came ahead of use).
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
  int entry_bytes = 0;  // a multiple of 16 (656 in fp8, 1152 in bf16, 2304 in f32)
};

// One launch: dense_slots always, the copies when `pool` is set (entries
// without a slot are left as they are: the attention never reads them).
void gather_entries(const GatherEntriesParams& params, cudaStream_t stream);

struct ScatterEntriesParams {
  const uint8_t* dense = nullptr;  // [entries, entry_bytes]
  const int32_t* slots = nullptr;  // [entries] where each goes in `pool`, -1 = nowhere
  int64_t entries = 0;
  uint8_t* pool = nullptr;  // [slots, entry_bytes]
  int entry_bytes = 0;      // a multiple of 16
};

// pool[slots[i]] = dense[i] for every slot >= 0.
void scatter_entries(const ScatterEntriesParams& params, cudaStream_t stream);

}  // namespace megactx::cuda
