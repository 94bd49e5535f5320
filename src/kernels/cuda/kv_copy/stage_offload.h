// The live host tier's staging of offload entries into device memory before
// a layer's sparse MLA reads them (offload pages, cache/kv_cache.h: latents
// in pinned host memory). Reading them straight from host memory inside the
// attention kernel (the fallback for steps larger than the staging) is
// latency-bound: on the H200 the cluster kernel took 2.3x the all-device time
// per decode step; one copy kernel with every entry in flight runs near the
// bus rate.
//
// A hot cache keeps staged entries across steps, since consecutive tokens of a
// request select mostly the same entries: per selection group (a full
// indexer layer and the shared layers that reuse its top-k) a direct-mapped
// table of `lines` tags (the offload slot each line holds; line map below), and
// per layer a device pool of `lines` entries. A step's selected offload slots
// that hit their line are read there; misses claim their line (one winner per
// line and step; a line hit this step is not taken) and are copied into it;
// the rest go to the per-step staging rows. Staged slots address three
// regions of the attention's entry space (SparseMlaParams): [pool_slots,
// pool_slots + lines) the hot pool, from pool_slots + lines the staging rows.
//
// The line of offload slot s (offset o = s - pool_slots from the first offload
// slot): consecutive slots on consecutive lines, so that a request whose
// offload slots lie in one cycle of `lines` never meets itself; each cycle
// c = o / lines rotated by its own hash, so that requests moved one after
// another (each a cycle of slots, offset by a page or two) do not put the
// same relative positions (a recent-token window, the first tokens) on the
// same lines. Plain modulo (kModulo) is kept for A/B runs; on the random-weight
// benchmark, whose selections are not position-aligned, both maps give the
// same hit rate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

enum class OffloadLineMap : int { kRotated = 0, kModulo = 1 };

// Which copies a stage_offload_entries launch makes: both, only the claimed
// misses into their hot lines (on a side stream, for every layer of a group
// right after its assignment), or only the staging rows (the layer's own
// launch then).
enum class OffloadCopies : int { kAll = 0, kLines = 1, kRows = 2 };

// Running counts of what the hot cache did (StageOffloadParams::counters),
// once per selection except copied_entries (every layer copies its own).
struct OffloadReadCounters {
  unsigned long long selected = 0;        // offload entries selected
  unsigned long long hot_hits = 0;        // read in place from an earlier step's line
  unsigned long long copied_entries = 0;  // copied host -> device (lines and staging rows)
  unsigned long long steps = 0;           // assignments with count_step (one per forward)
};

struct StageOffloadParams {
  const int32_t* slots = nullptr;         // [entries] physical slots, -1 = none
  int32_t* staged_slots = nullptr;        // [entries] what the attention reads (see above)
  int64_t entries = 0;                    // rows x top-k (at most the staging rows)
  int64_t pool_slots = 0;                 // slots from here on are offload slots
  const uint8_t* offload_pool = nullptr;  // [offload slots, entry_bytes] pinned host memory
  uint8_t* staging = nullptr;             // [entries, entry_bytes] device: the per-step rows
  int entry_bytes = 0;                    // a multiple of 16, at most 1024 (656: fp8 latent)
  // The hot cache (lines = 0: none; every offload entry goes to the staging rows).
  int64_t lines = 0;
  int32_t* tags = nullptr;      // [lines] the group's, persistent: offload slot held, -1 empty
  int32_t* claims = nullptr;    // [lines] per step: past every entry index between steps
  int32_t* hits = nullptr;      // [lines] per step: 0 between steps
  uint8_t* copy = nullptr;      // [entries] 1: this layer copies entry i into its line
  uint8_t* hot_pool = nullptr;  // [lines, entry_bytes] this layer's hot entries (device)
  OffloadLineMap line_map = OffloadLineMap::kRotated;
  OffloadCopies copies = OffloadCopies::kAll;
  // At most this many blocks of the copy (0: enough for every entry at once).
  // The side stream's fills run beside the compute stream: a grid of warps
  // stalled on the bus would hold every SM and the compute kernels would wait
  // behind it.
  int max_blocks = 0;
  bool count_step = false;                  // the assignment counts a step (the forward's first)
  OffloadReadCounters* counters = nullptr;  // device, accumulated; null: not counted
};

// Assigns the staged slots of a new selection (once per selection group and
// step): hits, claimed misses (copy[i] = 1) and staging rows; three launches.
// Without a hot cache it only writes the staged slots.
void assign_offload_entries(const StageOffloadParams& params, cudaStream_t stream);

// Copies this layer's entries: the claimed misses into hot_pool, the staging
// rows into staging (after assign_offload_entries of the same selection).
void stage_offload_entries(const StageOffloadParams& params, cudaStream_t stream);

// Pages whose offload entries were rewritten (a move to the tier): the lines
// of a group's table that hold one of their slots are emptied.
inline constexpr int kInvalidatePagesPerLaunch = 256;
struct InvalidateOffloadParams {
  int32_t* tags = nullptr;
  int64_t lines = 0;
  int64_t pool_slots = 0;  // as StageOffloadParams (lines count from the first offload slot)
  int64_t page_size = 0;
  OffloadLineMap line_map = OffloadLineMap::kRotated;
  int count = 0;  // pages in this launch
  int32_t pages[kInvalidatePagesPerLaunch];
};
void invalidate_offload_lines(const InvalidateOffloadParams& params, cudaStream_t stream);

}  // namespace megactx::cuda
