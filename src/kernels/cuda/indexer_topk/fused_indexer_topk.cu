// Fused indexer + top-k kernels (fused_indexer_topk.h has the design).
//
// Shapes inside one CTA (Heads = 32: 16 rows; Heads = 64: 8 rows):
//   Q tile, per consumer warpgroup: [256 columns = (row, head), 128 B] e4m3,
//     stored K-major in the 128-byte swizzle layout; column c = row * Heads + head;
//     bytes in the permuted k order below.
//   key page: [64 keys, 132 B] exactly as in the pool (bulk copy of 8448 B).
//   accumulators per warpgroup and page: [64 keys, 256 columns] fp32.
//   head sum on the tensor cores (the default), per warpgroup: W [16 sums,
//     256 columns] bf16, K-major in the 128-byte swizzle (four 64-column atoms
//     of 2 KiB); sum n < 8 holds the high bf16 part of row q's head weights,
//     8 + n the low part, n = q * (8 / rows per warpgroup); every other entry
//     0. Then sums[key, n] = relu(acc)[key, :] . W[n, :] (16 wgmma m64n16k16,
//     A from the accumulator registers, as FlashAttention-3 feeds P to P.V).
// The 128-dim dot product is summed in a permuted k order so that each thread
// reads 32 contiguous bytes of a key row straight from the page (bank-conflict
// free at the 132-byte pitch, as the decode scorer does): in k-step s (32 of the
// 128 dims), register a0 of thread t holds key bytes t*32 + s*8 + [0, 4) and a2
// bytes t*32 + s*8 + [4, 8); so the query's logical 16-byte chunk c (of 8) is
// its 4-byte words {c, 8 + c, 16 + c, 24 + c}.
#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/indexer_topk/fused_device.cuh"
#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"
#include "kernels/cuda/indexer_topk/fused_workspace.h"

namespace megactx::cuda {
namespace {

using namespace fused;

// The CTA by its consumer warpgroups; warpgroup w scores tile columns
// [w, w + 1) x kWgColumns.
//   Wgs = 4 (the default with the tensor-core head sum): 512 threads, all
//     consumers (m64n128 MMAs, 64 accumulators); thread 0 also issues the
//     key pages' bulk copies. No producer warpgroup: with one, the launch's
//     640 threads would cap every thread at 96 registers, and ptxas allocates
//     the consumers within that cap (setmaxnreg does not lift it): they spilled.
//   Wgs = 2 (every variant): 256 consumer threads (m64n256, 128 accumulators)
//     + a producer warpgroup whose first warp issues the copies; setmaxnreg
//     moves registers to the consumers (128 x 40 + 256 x 232 <= 384 x 168).
template <int Wgs>
struct Cta {
  static_assert(Wgs == 2 || Wgs == 4);
  static constexpr bool kProducerWarpgroup = Wgs == 2;
  static constexpr int kConsumers = 128 * Wgs;
  static constexpr int kThreads = kConsumers + (kProducerWarpgroup ? 128 : 0);
  static constexpr int kWgColumns = 512 / Wgs;                      // 256 or 128
  static constexpr int kQTileBytes = kWgColumns * kIndexerHeadDim;  // 32 or 16 KiB
  static constexpr int kAccumulators = kWgColumns / 2;              // fp32 per thread and page
  static constexpr int kHeadSumTileBytes = 16 * kWgColumns * 2;     // W: [16 sums][columns] bf16
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 384 * 168);
};
constexpr int kMaxWgs = 4;
// Named barriers: 2 + w warpgroup w (aligned: one instruction, converged);
// kTileBarrier all consumers and kTurnBarrier + w (ping-pong only; reached from
// both warpgroups' code, so the non-aligned kind).
constexpr int kTileBarrier = 2 + kMaxWgs;
// Ping-pong (two warpgroups): barrier kTurnBarrier + w = warpgroup w may issue
// its MMAs (the other warpgroup arrives on it after issuing its own).
constexpr int kTurnBarrier = kTileBarrier + 1;
constexpr int kStages = 4;                                  // key pages in flight per CTA
constexpr int kPageBytes = kPageTokens * kIndexerKeyBytes;  // 8448
constexpr int kBins = 2048;                                 // radix digits of 11 bits
// The consumers look for rows to compact after every 2^CheckShift pages (a
// warpgroup barrier each time), so a row's buffer is compacted once it passed
// kFusedCandidates less the entries that many pages can append. A template
// parameter: as a kernel argument it costs the page loop registers (88 B of
// spills against 68).
template <int CheckShift>
constexpr int kHighWater = kFusedCandidates - (kPageTokens << CheckShift);
constexpr unsigned kFullMask = 0xffffffffu;

// Shared memory, offsets from a 1024-byte aligned base (the swizzle atoms);
// the same for both CTA shapes.
constexpr int kQOffset = 0;                         // [512 columns][128 B]: Wgs tiles
constexpr int kStageOffset = kQOffset + 512 * 128;  // [kStages][64][132 B]
constexpr int kSelectOffset = kStageOffset + kStages * kPageBytes;
// Per warpgroup, for the radix select (the candidate keys stay in global
// memory: a 32 KiB copy per warpgroup would not fit four).
constexpr int kSelectKept = 0;                                     // uint2 [kFusedMaxTopk]
constexpr int kSelectHistogram = kSelectKept + kFusedMaxTopk * 8;  // uint32 [kBins]
constexpr int kSelectBytes = kSelectHistogram + kBins * 4;         // 24 KiB
// The head weights: float [512] for the CUDA-core head sum, or the
// warpgroups' bf16 W tiles for the tensor-core one (1024-byte aligned).
constexpr int kWeightOffset = kSelectOffset + kMaxWgs * kSelectBytes;
constexpr int kMiscOffset = kWeightOffset + 16 * 512 * 2;
static_assert(kWeightOffset % 1024 == 0 && kStageOffset % 1024 == 0, "swizzle atoms");

struct Misc {
  uint64_t full[kStages];                 // a page landed (producer's expect_tx + the copy)
  uint64_t empty[kStages];                // every consumer thread has read the page
  int count[kFusedMaxTileRows];           // candidate entries per row of the tile
  uint32_t threshold[kFusedMaxTileRows];  // ordered score a candidate must exceed
  // [warpgroup][page parity]: bit i = the warpgroup's row i passed the high
  // water mark during a page of that parity (parity keeps the next page's
  // atomics off the word being read).
  uint32_t need[kMaxWgs][2];
  int warp_sums[kMaxWgs][4];  // per-warpgroup scan scratch of the radix select
  int found_digit[kMaxWgs], found_need[kMaxWgs];
  int above[kMaxWgs], ties[kMaxWgs];
};
constexpr int kSharedBytes = kMiscOffset + static_cast<int>(sizeof(Misc)) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "shared memory of one CTA");

struct PlanParams {
  const int32_t* row_table = nullptr;      // [rows]
  const int32_t* row_visible = nullptr;    // [rows] or null
  const int32_t* row_positions = nullptr;  // [rows] when row_visible is null
  int rows = 0, tile_rows = 0, top_k = 0;
  int32_t* visible = nullptr;     // [rows] out
  int4* tiles = nullptr;          // [rows] out: first row, rows, key pages of the longest row
  int32_t* counters = nullptr;    // [1] out: tile count
  int32_t* out_counts = nullptr;  // [rows] optional out
};

struct KernelParams {
  FusedIndexerTopkParams p;
  const int32_t* visible = nullptr;  // [rows]
  const int4* tiles = nullptr;       // [tile count]: first row, rows, pages
  int32_t* counters = nullptr;       // [0] tile count
  uint32_t* keys = nullptr;          // [ctas, kFusedMaxTileRows, kFusedCandidates]
  int32_t* positions = nullptr;      // [ctas, kFusedMaxTileRows, kFusedCandidates]
};

struct MaxOp {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// One CTA: per-row visible lengths, then tiles of consecutive rows of one
// segment (equal row_table), tile_rows each from the segment's first row.
constexpr int kPlanThreads = 1024;
__global__ void __launch_bounds__(kPlanThreads) plan_tiles_kernel(PlanParams p) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage storage;
  __shared__ int carry_start, carry_tiles;
  if (threadIdx.x == 0) carry_start = carry_tiles = 0;
  __syncthreads();
  for (int base = 0; base < p.rows; base += kPlanThreads) {
    const int row = base + static_cast<int>(threadIdx.x);
    const bool in = row < p.rows;
    bool segment_start = false;
    if (in) {
      int visible = p.row_visible ? p.row_visible[row] : p.row_positions[row] + 1;
      visible = max(visible, 0);
      p.visible[row] = visible;
      if (p.out_counts) p.out_counts[row] = min(p.top_k, visible);
      segment_start = row == 0 || p.row_table[row] != p.row_table[row - 1];
    }
    int latest = 0;  // the last segment start at or before `row`
    Scan(storage).InclusiveScan(segment_start ? row : 0, latest, MaxOp());
    __syncthreads();
    latest = max(latest, carry_start);
    const bool tile_start = in && (segment_start || (row - latest) % p.tile_rows == 0);
    int index = 0, total = 0;
    Scan(storage).ExclusiveSum(tile_start ? 1 : 0, index, total);
    if (tile_start) p.tiles[carry_tiles + index] = make_int4(row, 0, 0, 0);
    __syncthreads();  // every thread has read carry_*
    if (threadIdx.x == kPlanThreads - 1) {
      carry_start = latest;
      carry_tiles += total;
    }
    __syncthreads();
  }
  const int count = carry_tiles;
  for (int i = threadIdx.x; i < count; i += kPlanThreads) {
    const int next = i + 1 < count ? p.tiles[i + 1].x : p.rows;
    // The tile's rows, and the pages its longest row reads: found once here
    // rather than by every thread of the main kernel at every tile start.
    const int first = p.tiles[i].x, rows = next - first;
    int longest = 0;
    for (int r = 0; r < rows; ++r) longest = max(longest, p.visible[first + r]);
    p.tiles[i].y = rows;
    p.tiles[i].z = (longest + kPageTokens - 1) / kPageTokens;
  }
  if (threadIdx.x == 0) {
    p.counters[0] = count;
  }
}

__device__ __forceinline__ uint32_t load_u32(const uint8_t* pointer) {
  return *reinterpret_cast<const uint32_t*>(pointer);
}

// The exact top_k of a row's candidate buffer (count > top_k entries, or any
// count when Final), by the 128 threads of warpgroup `wg`: three radix passes
// (11, 11, 10 bits) over the keys (read from the global buffer, 16 per thread
// in flight: a compaction is rare, a few per row per million keys), then the kept
// entries (all above the k-th key, ties at it up to top_k) gathered in
// shared memory. Final: their positions go to out_row [top_k] (-1 padding
// when count <= top_k). Otherwise they become the buffer's first top_k
// entries, the k-th key its threshold, and `bit` (the row within its
// warpgroup) is cleared from the warpgroup's high-water flags.
template <bool Final>
__device__ void select_top_k(int wg, int row, int bit, int top_k, uint32_t* keys_g,
                             int32_t* positions_g, uint8_t* scratch, Misc& misc, int32_t* out_row) {
  const int wtid = static_cast<int>(threadIdx.x) % 128;
  const int lane = wtid % 32, warp = wtid / 32;
  const int barrier = 2 + wg;
  uint2* kept_s = reinterpret_cast<uint2*>(scratch + kSelectKept);
  uint32_t* histogram = reinterpret_cast<uint32_t*>(scratch + kSelectHistogram);
  constexpr int kPerThread = kFusedMaxTopk / 128;  // kept entries per thread
  const int n = misc.count[row];
  if (Final && n <= top_k) {
    // All loads first, then the stores: one round trip to L2, not kPerThread.
    int32_t taken[kPerThread];
#pragma unroll
    for (int m = 0; m < kPerThread; ++m) {
      const int i = wtid + 128 * m;
      taken[m] = i < n ? positions_g[i] : -1;
    }
#pragma unroll
    for (int m = 0; m < kPerThread; ++m)
      if (wtid + 128 * m < top_k) out_row[wtid + 128 * m] = taken[m];
    return;
  }
  // The buffer's keys, n of them: f(key) for each, a batch of 16-byte loads in
  // flight per thread (the tail one key at a time).
  auto for_each_key = [&](auto&& f) {
    constexpr int kBatch = 4;
    const int vectors = n / 4;
    const uint4* source = reinterpret_cast<const uint4*>(keys_g);
    for (int base = 0; base < vectors; base += 128 * kBatch) {
      uint4 v[kBatch];
#pragma unroll
      for (int m = 0; m < kBatch; ++m) {
        const int i = base + wtid + 128 * m;
        v[m] = i < vectors ? source[i] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int m = 0; m < kBatch; ++m)
        if (base + wtid + 128 * m < vectors) {
          f(v[m].x);
          f(v[m].y);
          f(v[m].z);
          f(v[m].w);
        }
    }
    for (int i = vectors * 4 + wtid; i < n; i += 128) f(keys_g[i]);
  };

  uint32_t prefix = 0;
  int need = top_k;
#pragma unroll
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
    const int bits = level == 2 ? 10 : 11;
    const int bins = 1 << bits;
    for (int i = wtid; i < bins; i += 128) histogram[i] = 0;
    named_barrier_aligned(barrier, 128);
    for_each_key([&](uint32_t key) {
      if (level == 0 || (key >> (shift + bits)) == prefix)
        atomicAdd(&histogram[(key >> shift) & (bins - 1)], 1u);
    });
    named_barrier_aligned(barrier, 128);
    // Thread i owns `per` bins i-th from the top; an exclusive scan counts
    // the keys in bins above its own.
    const int per = bins / 128;
    const int top = bins - wtid * per;
    int own = 0;
    for (int b = top - 1; b >= top - per; --b) own += static_cast<int>(histogram[b]);
    int inclusive = own;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int other = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    if (lane == 31) misc.warp_sums[wg][warp] = inclusive;
    named_barrier_aligned(barrier, 128);
    int above = inclusive - own;
    for (int w = 0; w < warp; ++w) above += misc.warp_sums[wg][w];
    if (above < need && above + own >= need) {
      int count = above;
      for (int b = top - 1; b >= top - per; --b) {
        const int here = static_cast<int>(histogram[b]);
        if (count + here >= need) {
          misc.found_digit[wg] = b;
          misc.found_need[wg] = need - count;
          break;
        }
        count += here;
      }
    }
    named_barrier_aligned(barrier, 128);
    prefix = (level == 0 ? 0u : (prefix << bits)) | static_cast<uint32_t>(misc.found_digit[wg]);
    need = misc.found_need[wg];
  }
  // prefix is the k-th largest key; `need` of the keys equal to it are kept.
  if (wtid == 0) misc.above[wg] = misc.ties[wg] = 0;
  named_barrier_aligned(barrier, 128);
  const int above_total = top_k - need;
  const unsigned lower_lanes = (1u << lane) - 1;
  // Batches of 4 x 128 keys, loaded before any is placed.
  constexpr int kScanBatch = 4;
  for (int batch = 0; batch < n; batch += 128 * kScanBatch) {
    uint32_t keys[kScanBatch];
#pragma unroll
    for (int m = 0; m < kScanBatch; ++m) {
      const int i = batch + 128 * m + wtid;
      keys[m] = i < n ? keys_g[i] : 0u;
    }
#pragma unroll
    for (int m = 0; m < kScanBatch; ++m) {
      const int i = batch + 128 * m + wtid;
      if (batch + 128 * m >= n) break;  // uniform over the warpgroup
      const uint32_t key = keys[m];
      const bool is_above = i < n && key > prefix;
      const bool is_tie = i < n && key == prefix;
      const unsigned above_mask = __ballot_sync(kFullMask, is_above);
      const unsigned tie_mask = __ballot_sync(kFullMask, is_tie);
      int above_base = 0, tie_base = 0;
      if (lane == 0) {
        if (above_mask) above_base = atomicAdd(&misc.above[wg], __popc(above_mask));
        if (tie_mask) tie_base = atomicAdd(&misc.ties[wg], __popc(tie_mask));
      }
      above_base = __shfl_sync(kFullMask, above_base, 0);
      tie_base = __shfl_sync(kFullMask, tie_base, 0);
      // Kept: (key, buffer index); the positions are gathered below in one batch.
      if (is_above) {
        kept_s[above_base + __popc(above_mask & lower_lanes)] =
            make_uint2(key, static_cast<uint32_t>(i));
      } else if (is_tie) {
        const int tie = tie_base + __popc(tie_mask & lower_lanes);
        if (tie < need) kept_s[above_total + tie] = make_uint2(key, static_cast<uint32_t>(i));
      }
    }
  }
  named_barrier_aligned(barrier, 128);
  int32_t gathered[kPerThread];
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) {
    const int j = wtid + 128 * m;
    gathered[m] = j < top_k ? positions_g[kept_s[j].y] : 0;
  }
  if constexpr (Final) {
#pragma unroll
    for (int m = 0; m < kPerThread; ++m)
      if (wtid + 128 * m < top_k) out_row[wtid + 128 * m] = gathered[m];
  } else {
    named_barrier_aligned(barrier, 128);  // every read of the buffer is done: overwrite its front
#pragma unroll
    for (int m = 0; m < kPerThread; ++m) {
      const int j = wtid + 128 * m;
      if (j < top_k) {
        keys_g[j] = kept_s[j].x;
        positions_g[j] = gathered[m];
      }
    }
    if (wtid == 0) {
      misc.count[row] = top_k;
      misc.threshold[row] = prefix;
      misc.need[wg][0] &= ~(1u << bit);
      misc.need[wg][1] &= ~(1u << bit);
    }
  }
  named_barrier_aligned(barrier, 128);
}

template <int Heads, bool Wgmma, bool PingPong, bool TensorSum, int Wgs, int CheckShift>
__global__ void __launch_bounds__(Cta<Wgs>::kThreads, 1)
    fused_indexer_topk_kernel(KernelParams kp) {
  static_assert(Wgmma || !PingPong, "ping-pong needs asynchronous MMAs");
  static_assert(Wgmma || !TensorSum, "the tensor-core head sum is a wgmma");
  static_assert(Wgs == 2 || (TensorSum && !PingPong), "four warpgroups: tensor-core head sum only");
  using C = Cta<Wgs>;
  constexpr int kConsumers = C::kConsumers;
  constexpr int kWgColumns = C::kWgColumns, kQTileBytes = C::kQTileBytes;
  constexpr int kHeadSumTileBytes = C::kHeadSumTileBytes;
  constexpr int kRowsPerWg = kWgColumns / Heads;  // 8 or 4 (two warpgroups), 4 or 2 (four)
  constexpr int kTileRows = Wgs * kRowsPerWg;     // 16 or 8
  constexpr int kGroupsPerRow = Heads / 8;        // accumulator column groups of one row
  constexpr int kHalf = kRowsPerWg / 2;
  // Rows a lane holds after the head sum (lane t: rows t * kRowsPerLane + i;
  // with 2 rows per warpgroup lanes 2 and 3 hold none).
  constexpr int kRowsPerLane = kRowsPerWg >= 4 ? kRowsPerWg / 4 : 1;
  constexpr int kWeightsPerLane = 2 * kGroupsPerRow;
  // W's sum n of the warpgroup's row q: q * kSumColumn (columns 2t, 2t + 1
  // are lane t's).
  constexpr int kSumColumn = kRowsPerWg >= 4 ? 8 / kRowsPerWg : 2;
  static_assert(kTileRows <= kFusedMaxTileRows && kTileRows * Heads == 512);
  const FusedIndexerTopkParams& p = kp.p;

  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  uint8_t* q_tiles = shared + kQOffset;
  uint8_t* stages = shared + kStageOffset;
  uint8_t* weight_tiles = shared + kWeightOffset;
  float* weights_s = reinterpret_cast<float*>(weight_tiles);
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const bool producer = tid >= kConsumers;
  if (tid == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(&misc.full[stage], 1);
      mbarrier_init(&misc.empty[stage], kConsumers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // Pages streamed so far (every thread counts the same pages): ring slot and phase.
  uint32_t ring = 0;
  const int64_t buffer0 = static_cast<int64_t>(blockIdx.x) * kFusedMaxTileRows;
  // The tiles are dealt to the CTAs in a fixed order, heaviest (last rows)
  // first, snaking over the CTAs round by round so that every CTA's total stays
  // within about a tile of the others'. Every role of a CTA walks the same tiles
  // without sharing a claim: no CTA-wide barrier between tiles (one reached from
  // the producer's and each warpgroup's code would have to be the non-aligned
  // kind, and that made the kernel 11% slower).
  int row0 = 0, tile_rows = 0, pages = 0, round = 0;
  auto next_tile = [&]() -> bool {
    const int grid = static_cast<int>(gridDim.x), cta = static_cast<int>(blockIdx.x);
    const int claimed = round * grid + ((round & 1) ? grid - 1 - cta : cta);
    ++round;
    const int tile_count = kp.counters[0];
    if (claimed >= tile_count) return false;
    const int4 tile = kp.tiles[tile_count - 1 - claimed];  // heaviest (last rows) first
    row0 = tile.x;
    tile_rows = tile.y;
    if constexpr (Heads == 32) {
      pages = tile.z;  // the planner's (GLM-5.2's 32 heads: 3% faster at 128K and 1M)
    } else {
      // 64 heads (DeepSeek-V3.2): the same count from the tile's rows, which
      // ptxas allocates better in this variant (the planner's count measured
      // 4% slower here: 19.2 against 18.4 ms at 32K).
      int longest = 0;
      for (int i = 0; i < tile_rows; ++i) longest = max(longest, kp.visible[row0 + i]);
      pages = (longest + kPageTokens - 1) / kPageTokens;
    }
    return true;
  };

  // The i-th page a tile streams: its newest first by default (newest_first),
  // so that a row whose scores favour recent keys (an indexer's usual recency
  // bias) raises its threshold early and appends, and compacts, less.
  auto page_order = [&](int i) { return p.newest_first ? pages - 1 - i : i; };

  // The bulk copy of the tile's page `page_id` into the ring slot of the
  // ring-th page streamed (once the slot's previous page has been read by all).
  auto issue_page = [&](uint32_t ring, int page_id) {
    const int stage = static_cast<int>(ring % kStages);
    mbarrier_wait(&misc.empty[stage], ((ring / kStages) & 1u) ^ 1u);
    mbarrier_arrive_expect_bytes(&misc.full[stage], kPageBytes);
    bulk_copy_to_shared(stages + stage * kPageBytes,
                        p.key_pool + static_cast<int64_t>(page_id) * kPageBytes, kPageBytes,
                        &misc.full[stage]);
  };

  if (C::kProducerWarpgroup && producer) {
    // The producer warpgroup gives registers to the consumers; its first warp
    // streams the pages, the other three only follow the tile barriers.
    set_max_registers_dec<C::kProducerRegisters>();
    while (next_tile()) {
      if (tid >= kConsumers + 32) continue;
      // Page ids 32 at a time (one per lane), the next 32 loaded a block ahead.
      const int32_t* table = p.page_tables + p.row_table[row0];
      int next_id = lane < pages ? table[page_order(lane)] : 0;
      for (int base = 0; base < pages; base += 32) {
        const int ids = next_id;
        if (base + 32 + lane < pages) next_id = table[page_order(base + 32 + lane)];
        const int count = min(32, pages - base);
        for (int i = 0; i < count; ++i, ++ring) {
          const int page_id = __shfl_sync(kFullMask, ids, i);
          if (lane == 0) issue_page(ring, page_id);
        }
      }
      __syncwarp();
    }
    return;
  }

  if constexpr (C::kProducerWarpgroup) set_max_registers_inc<C::kConsumerRegisters>();
  // Each warpgroup runs its own copy of the consumer loop with its index a
  // constant, so that every shared-memory address and wgmma descriptor it
  // builds is warp-uniform to the compiler (uniform registers, no per-page
  // register-to-uniform moves).
  auto consume = [&]<int kWg>() {
    while (next_tile()) {
      // ---- Consumers -------------------------------------------------------------
      const int wg = kWg, wtid = tid % 128, warp = wtid / 32;
      const int g = lane / 4, t = lane % 4;
      // Ping-pong: warpgroup 1's first arrival of a tile must not reach
      // warpgroup 0's turn barrier before warpgroup 0 has taken the last one of
      // the previous tile (reached from both warpgroups' code: non-aligned).
      if constexpr (PingPong) named_barrier(kTileBarrier, kConsumers);
      // The tile's queries (permuted k order, swizzled) and weights into shared memory.
      // The warpgroup's own rows (nothing here waits for another warpgroup):
      // their queries (permuted k order, swizzled), head weights and counters.
      for (int n = wtid; n < kRowsPerWg * Heads; n += 128) {
        const int row = wg * kRowsPerWg + n / Heads, head = n % Heads;
        const int column = n;  // (row % kRowsPerWg) * Heads + head
        uint32_t w[32];
        if (row < tile_rows) {
          const uint4* source = reinterpret_cast<const uint4*>(
              p.queries + (static_cast<int64_t>(row0 + row) * Heads + head) * kIndexerHeadDim);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint4 v = source[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 32; ++i) w[i] = 0;
        }
        uint8_t* destination = q_tiles + wg * kQTileBytes + column * kIndexerHeadDim;
#pragma unroll
        for (int c = 0; c < 8; ++c)
          *reinterpret_cast<uint4*>(destination + ((c ^ (column & 7)) * 16)) =
              make_uint4(w[c], w[8 + c], w[16 + c], w[24 + c]);
        if constexpr (!TensorSum) {
          // head = 8 * group + 2 * lane_t + e: lane t's weights of a row are contiguous.
          const int group = head / 8, pair = head % 8;
          weights_s[(row * 4 + pair / 2) * kWeightsPerLane + group * 2 + pair % 2] =
              row < tile_rows ? p.weights[static_cast<int64_t>(row0 + row) * Heads + head] : 0.f;
        }
      }
      if constexpr (TensorSum) {
        // W, 16-byte chunks of 8 columns: (sum n, chunk kc of kChunks).
        constexpr int kChunks = kWgColumns / 8;  // per sum n
        for (int chunk = wtid; chunk < 16 * kChunks; chunk += 128) {
          const int n = chunk / kChunks, kc = chunk % kChunks;
          const int q = 8 * kc / Heads;  // the warpgroup's row of these 8 columns
          const int row = wg * kRowsPerWg + q;
          uint32_t packed[4] = {0u, 0u, 0u, 0u};
          if (n % 8 == q * kSumColumn && row < tile_rows) {
            const float* w = p.weights + static_cast<int64_t>(row0 + row) * Heads + 8 * kc % Heads;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const float v = w[e];
              const __nv_bfloat16 high = __float2bfloat16_rn(v);
              const __nv_bfloat16 part =
                  n < 8 ? high : __float2bfloat16_rn(v - __bfloat162float(high));
              packed[e / 2] |= static_cast<uint32_t>(__bfloat16_as_ushort(part)) << (16 * (e % 2));
            }
          }
          uint8_t* line = weight_tiles + wg * kHeadSumTileBytes + (kc / 8) * 2048 + (n / 8) * 1024 +
                          (n % 8) * 128;
          *reinterpret_cast<uint4*>(line + (((kc % 8) ^ (n % 8)) * 16)) =
              make_uint4(packed[0], packed[1], packed[2], packed[3]);
        }
      }
      if (wtid < kRowsPerWg) {
        misc.count[wg * kRowsPerWg + wtid] = 0;
        misc.threshold[wg * kRowsPerWg + wtid] = 0;  // every ordered score but NaN's lowest
      }
      if (wtid < 2) misc.need[wg][wtid] = 0;
      fence_proxy_async_shared();  // the Q tile is read by wgmma (async proxy)
      named_barrier_aligned(2 + wg, 128);
      // Ping-pong: warpgroup 0 issues first in every tile; afterwards each
      // issues after the other has (so one arrival of warpgroup 1 on warpgroup
      // 0's barrier is pending between pages, consumed at the tile's end).
      if constexpr (PingPong)
        if (wg == 1) named_barrier_arrive(kTurnBarrier, kConsumers);

      const int rows_here = min(max(tile_rows - wg * kRowsPerWg, 0), kRowsPerWg);
      const bool active = rows_here > 0;
      uint8_t* q_tile = q_tiles + wg * kQTileBytes;
      uint8_t* scratch = shared + kSelectOffset + wg * kSelectBytes;
      uint32_t* keys_g = kp.keys + buffer0 * kFusedCandidates;
      int32_t* positions_g = kp.positions + buffer0 * kFusedCandidates;
      const bool debug = p.debug_scores != nullptr;

      // The score of key 16 * warp + g + 8r of `page` for tile row `row` (keys
      // visible to it: `visible`, 0 for a lane without a row) joins the row's
      // candidates when above its threshold: one shared atomic per (warp, row)
      // through ballots (every lane calls it). `check`: the check interval
      // whose high-water flags it sets (the compaction after its last page looks).
      auto append = [&](int page, int check, int r, float score, int row, int visible,
                        uint32_t threshold) {
        const int position = page * kPageTokens + 16 * warp + g + 8 * r;
        if (debug && position < visible)
          p.debug_scores[static_cast<int64_t>(row0 + row) * p.debug_stride + position] = score;
        const uint32_t key = float_to_ordered(score);
        const bool pass = position < visible && key > threshold;
        const unsigned mask = __ballot_sync(kFullMask, pass);
        if (mask == 0) return;
        const unsigned group = mask & (0x11111111u << t);  // lanes of the same row
        const int leader = group ? __ffs(group) - 1 : lane;
        int base = 0;
        if (pass && lane == leader) {
          const int added = __popc(group);
          base = atomicAdd(&misc.count[row], added);
          if (base <= kHighWater<CheckShift> && base + added > kHighWater<CheckShift>)
            atomicOr(&misc.need[wg][check & 1], 1u << (row - wg * kRowsPerWg));
        }
        base = __shfl_sync(kFullMask, base, leader);
        if (pass) {
          const int64_t at = static_cast<int64_t>(row) * kFusedCandidates + base +
                             __popc(group & ((1u << lane) - 1));
          keys_g[at] = key;
          positions_g[at] = position;
        }
      };
      // After the candidates flagged with `check`: the rows past the high-water
      // mark compacted to top_k (their thresholds rise). True when any was.
      auto compact = [&](int check) -> bool {
        named_barrier_aligned(2 + wg, 128);  // every warp's candidates are in
        const uint32_t need = misc.need[wg][check & 1];
        if (need == 0) return false;
        for (int q = 0; q < kRowsPerWg; ++q) {
          if (((need >> q) & 1u) == 0) continue;
          const int row = wg * kRowsPerWg + q;
          select_top_k<false>(wg, row, q, p.top_k, keys_g + row * kFusedCandidates,
                              positions_g + row * kFusedCandidates, scratch, misc, nullptr);
        }
        return true;
      };

      {
        int my_row[kRowsPerLane], my_visible[kRowsPerLane];
        uint32_t my_threshold[kRowsPerLane];
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          const int q = t * kRowsPerLane + i;  // the lane's row of the warpgroup, if any
          my_row[i] = wg * kRowsPerWg + (q < kRowsPerWg ? q : 0);
          my_visible[i] =
              q < kRowsPerWg && my_row[i] < tile_rows ? kp.visible[row0 + my_row[i]] : 0;
          my_threshold[i] = 0;
        }
        // Without a producer warpgroup thread 0 streams the tile's pages,
        // kStages - 1 ahead of its own (the page id one further ahead loaded).
        const bool issuer = !C::kProducerWarpgroup && kWg == 0 && wtid == 0;
        const int32_t* table = issuer ? p.page_tables + p.row_table[row0] : nullptr;
        int pending_id = 0;
        if (issuer) {
          const int ahead = min(kStages - 1, pages);
          for (int q = 0; q < ahead; ++q) issue_page(ring + q, table[page_order(q)]);
          if (ahead < pages) pending_id = table[page_order(ahead)];
        }
        // The wgmma descriptors' low words, once per tile: built from the
        // addresses inside the loop they cost ~50 uniform instructions per
        // page (of ~250), recomputed for each of the twelve MMAs.
        const uint32_t q_descriptor = swizzle128_descriptor_low(shared_address(q_tile));
        const uint32_t w_descriptor =
            swizzle128_descriptor_low(shared_address(weight_tiles + wg * kHeadSumTileBytes));
        for (int page = 0; page < pages; ++page, ++ring) {
          if (issuer && page + kStages - 1 < pages) {
            issue_page(ring + kStages - 1, pending_id);
            if (page + kStages < pages) pending_id = table[page_order(page + kStages)];
          }
          __syncwarp();
          const int stage = static_cast<int>(ring % kStages);
          mbarrier_wait(&misc.full[stage], (ring / kStages) & 1u);
          const uint8_t* keys = stages + stage * kPageBytes;
          uint32_t a[4][4];
          float scale[2] = {0.f, 0.f};
          if (active) {
            const uint8_t* key0 = keys + (16 * warp + g) * kIndexerKeyBytes;
            const uint8_t* key1 = key0 + 8 * kIndexerKeyBytes;
#pragma unroll
            for (int s = 0; s < 4; ++s) {
              a[s][0] = load_u32(key0 + t * 32 + s * 8);
              a[s][1] = load_u32(key1 + t * 32 + s * 8);
              a[s][2] = load_u32(key0 + t * 32 + s * 8 + 4);
              a[s][3] = load_u32(key1 + t * 32 + s * 8 + 4);
            }
            scale[0] = *reinterpret_cast<const float*>(key0 + kIndexerHeadDim);
            scale[1] = *reinterpret_cast<const float*>(key1 + kIndexerHeadDim);
          }
          // The page is in registers now. Every thread arrives for its own reads:
          // one arrival per warp after __syncwarp measured no faster (1M keys:
          // 30.3 vs 30.9 ms) and racecheck reports it against the next bulk copy.
          mbarrier_arrive(&misc.empty[stage]);
          // Both warpgroups take their turn every page, with work or without.
          if constexpr (PingPong) named_barrier(kTurnBarrier + wg, kConsumers);
          if (!active) {
            if constexpr (PingPong) named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumers);
            continue;
          }

          // acc[key, column] for this warp's 16 keys (rows g, g + 8) x 256 columns.
          float d[C::kAccumulators];
          if constexpr (Wgmma) {
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 4; ++s) {
              // k-step s starts 32 bytes further: 2 in the address field.
              const uint64_t q =
                  descriptor_from_words(q_descriptor + 2 * s, kSwizzle128DescriptorHigh);
              if constexpr (Wgs == 2)
                wgmma_m64n256k32_e4m3(d, a[s], q, s);
              else
                wgmma_m64n128k32_e4m3(d, a[s], q, s);
            }
            wgmma_commit();
            // The other warpgroup's MMAs queue behind these and run during this
            // one's epilogue.
            if constexpr (PingPong) named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumers);
            wgmma_wait_all();
#pragma unroll
            for (int i = 0; i < C::kAccumulators; ++i) fence_operand(d[i]);
          } else {
#pragma unroll
            for (int j = 0; j < 32; ++j) {
              float c[4] = {0.f, 0.f, 0.f, 0.f};
              const uint8_t* column = q_tile + (8 * j + g) * kIndexerHeadDim + 4 * t;
#pragma unroll
              for (int s = 0; s < 4; ++s) {
                const uint32_t b0 = load_u32(column + (((2 * s) ^ g) * 16));
                const uint32_t b1 = load_u32(column + (((2 * s + 1) ^ g) * 16));
                mma_e4m3_16x8x32(c, a[s], b0, b1);
              }
#pragma unroll
              for (int i = 0; i < 4; ++i) d[4 * j + i] = c[i];
            }
          }

          float score[2][kRowsPerLane];
          if constexpr (TensorSum) {
            // sums[key, n] = relu(acc) . W: the accumulator pairs are the A fragments.
            uint32_t relu_pairs[C::kAccumulators / 2];
#pragma unroll
            for (int i = 0; i < C::kAccumulators / 2; ++i)
              relu_pairs[i] = relu_bf16x2(d[2 * i], d[2 * i + 1]);
            float sums[8];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kWgColumns / 16; ++kk)
              wgmma_m64n16k16_bf16(sums, relu_pairs + 4 * kk,
                                   descriptor_from_words(
                                       w_descriptor + (kk / 4) * (2048 >> 4) + (kk % 4) * (32 >> 4),
                                       kSwizzle128DescriptorHigh),
                                   kk);
            wgmma_commit();
            wgmma_wait_all();
#pragma unroll
            for (int i = 0; i < 8; ++i) fence_operand(sums[i]);
              // Lane t's rows are sums 2t + i (high parts) and 8 + 2t + i (low parts).
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int i = 0; i < kRowsPerLane; ++i)
                score[r][i] = (sums[2 * r + i] + sums[4 + 2 * r + i]) * scale[r];
          } else {
            // relu * weight summed over this lane's heads: partial[key r][row].
            float partial[2][kRowsPerWg];
#pragma unroll
            for (int q = 0; q < kRowsPerWg; ++q) {
              const float4* wp = reinterpret_cast<const float4*>(
                  weights_s + ((wg * kRowsPerWg + q) * 4 + t) * kWeightsPerLane);
              float w[kWeightsPerLane];
#pragma unroll
              for (int i = 0; i < kWeightsPerLane / 4; ++i) {
                const float4 v = wp[i];
                w[4 * i] = v.x;
                w[4 * i + 1] = v.y;
                w[4 * i + 2] = v.z;
                w[4 * i + 3] = v.w;
              }
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                float sum = 0.f;
#pragma unroll
                for (int jj = 0; jj < kGroupsPerRow; ++jj)
#pragma unroll
                  for (int e = 0; e < 2; ++e)
                    sum = fmaf(w[2 * jj + e],
                               fmaxf(d[4 * (q * kGroupsPerRow + jj) + 2 * r + e], 0.f), sum);
                partial[r][q] = sum;
              }
            }
            // Sum over the four lanes t of a key row while scattering the rows:
            // afterwards lane t holds rows t * kRowsPerLane + i, complete.
            const bool hi = (t & 2) != 0, lo = (t & 1) != 0;
            float kept[2][kHalf];
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int i = 0; i < kHalf; ++i) {
                const float send = hi ? partial[r][i] : partial[r][kHalf + i];
                const float mine = hi ? partial[r][kHalf + i] : partial[r][i];
                kept[r][i] = mine + __shfl_xor_sync(kFullMask, send, 2);
              }
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int i = 0; i < kRowsPerLane; ++i) {
                const float send = lo ? kept[r][i] : kept[r][kRowsPerLane + i];
                const float mine = lo ? kept[r][kRowsPerLane + i] : kept[r][i];
                score[r][i] = (mine + __shfl_xor_sync(kFullMask, send, 1)) * scale[r];
              }
          }

#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int i = 0; i < kRowsPerLane; ++i)
              append(page_order(page), page >> CheckShift, r, score[r][i], my_row[i], my_visible[i],
                     my_threshold[i]);
          if (((page + 1) & ((1 << CheckShift) - 1)) == 0 && compact(page >> CheckShift)) {
#pragma unroll
            for (int i = 0; i < kRowsPerLane; ++i) my_threshold[i] = misc.threshold[my_row[i]];
          }
        }
      }

      if constexpr (PingPong)
        if (wg == 0) named_barrier(kTurnBarrier, kConsumers);
      // The tile's result rows.
      if (active) {
        named_barrier_aligned(2 + wg, 128);
        for (int q = 0; q < rows_here; ++q) {
          const int row = wg * kRowsPerWg + q;
          select_top_k<true>(wg, row, q, p.top_k, keys_g + row * kFusedCandidates,
                             positions_g + row * kFusedCandidates, scratch, misc,
                             p.out + static_cast<int64_t>(row0 + row) * p.top_k);
        }
      }
    }
  };
  if (tid < 128)
    consume.template operator()<0>();
  else if (tid < 256)
    consume.template operator()<1>();
  else if constexpr (Wgs == 4) {
    if (tid < 384)
      consume.template operator()<2>();
    else
      consume.template operator()<3>();
  }
}

template <int Heads, bool Wgmma, bool PingPong, bool TensorSum, int Wgs = 2, int CheckShift = 0>
void launch(const FusedIndexerTopkParams& params, int ctas, cudaStream_t stream) {
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
        fused_indexer_topk_kernel<Heads, Wgmma, PingPong, TensorSum, Wgs, CheckShift>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    return true;
  }();
  (void)configured;
  const WorkspaceLayout layout = workspace_layout(params.rows, ctas);
  uint8_t* workspace = static_cast<uint8_t*>(params.workspace);
  PlanParams plan;
  plan.row_table = params.row_table;
  plan.row_visible = params.row_visible;
  plan.row_positions = params.row_positions;
  plan.rows = params.rows;
  plan.tile_rows = fused_tile_rows(Heads);
  plan.top_k = params.top_k;
  plan.visible = reinterpret_cast<int32_t*>(workspace + layout.visible);
  plan.tiles = reinterpret_cast<int4*>(workspace + layout.tiles);
  plan.counters = reinterpret_cast<int32_t*>(workspace + layout.counters);
  plan.out_counts = params.out_counts;
  plan_tiles_kernel<<<1, kPlanThreads, 0, stream>>>(plan);
  MEGACTX_CUDA_CHECK(cudaGetLastError());

  KernelParams kernel;
  kernel.p = params;
  kernel.visible = plan.visible;
  kernel.tiles = plan.tiles;
  kernel.counters = plan.counters;
  kernel.keys = reinterpret_cast<uint32_t*>(workspace + layout.keys);
  kernel.positions = reinterpret_cast<int32_t*>(workspace + layout.positions);
  const unsigned grid = static_cast<unsigned>(std::min(ctas, params.rows));
  fused_indexer_topk_kernel<Heads, Wgmma, PingPong, TensorSum, Wgs, CheckShift>
      <<<grid, Cta<Wgs>::kThreads, kSharedBytes, stream>>>(kernel);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

namespace detail {

void launch_fused_indexer_topk(const FusedIndexerTopkParams& params, int ctas,
                               cudaStream_t stream) {
  if (params.rows == 0) return;
  const bool ping_pong = params.wgmma && params.ping_pong;
  const bool tensor_sum = params.wgmma && params.tensor_head_sum;  // never with ping_pong
  auto wgmma = [&]<int Heads>() {
    if (tensor_sum) {
      if (params.consumer_warpgroups == 2)
        return launch<Heads, true, false, true, 2>(params, ctas, stream);
      const int check_pages = params.check_pages > 0 ? params.check_pages : kFusedCheckPages;
      if (check_pages == 4) return launch<Heads, true, false, true, 4, 2>(params, ctas, stream);
      return launch<Heads, true, false, true, 4>(params, ctas, stream);
    }
    ping_pong ? launch<Heads, true, true, false>(params, ctas, stream)
              : launch<Heads, true, false, false>(params, ctas, stream);
  };
  if (params.heads == 32) {
    if (!params.wgmma) return launch<32, false, false, false>(params, ctas, stream);
    wgmma.template operator()<32>();
  } else {
    if (!params.wgmma) return launch<64, false, false, false>(params, ctas, stream);
    wgmma.template operator()<64>();
  }
}

}  // namespace detail
}  // namespace megactx::cuda
