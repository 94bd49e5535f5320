// The fp8-ring sparse MLA prefill kernel's parts below its consumers' two
// forms (sparse_mla_prefill_fp8ring.cu, which says what the layout does and
// why): the shared-memory layout and its barriers, the work items of the
// persistent launch, the producer, and the consumers' stages (the Q tile, the
// score MMAs, masking, the block maxima, P^T, the output MMAs, the rescale and
// the epilogue) that the lockstep and ping-pong consumers compose. Only for
// that .cu file.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/sparse_mla/fp8_fragments.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla_prefill_tiles.cuh"

namespace megactx::cuda::fp8ring {

using sparse_mla_prefill::bunch_range;
using sparse_mla_prefill::BunchRange;
using sparse_mla_prefill::kDim;
using sparse_mla_prefill::kHeads;
using sparse_mla_prefill::kLn2;
using sparse_mla_prefill::kLog2e;
using sparse_mla_prefill::kQChunkBytes;
using sparse_mla_prefill::kQueryPrescale;
using sparse_mla_prefill::kRescaleSlack;
using sparse_mla_prefill::swizzled;

constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kConsumerRegisters = 232;
constexpr int kProducerRegisters = 40;
static_assert(kConsumerThreads * kConsumerRegisters +
                      (kThreads - kConsumerThreads) * kProducerRegisters <=
                  65536,
              "setmaxnreg would ask for more registers than the launch holds");

constexpr int kBlockKeys = 64;
constexpr int kBunchKeys = 2 * kBlockKeys;
constexpr int kSlots = 3;  // ring slots of one block each
// How far ahead of its copies the producer prefetches blocks into L2: 3, 4 or
// 6 ran 2-17% slower over 128K and 1M pools on an H100 (more of L2 held
// for the prefetches than they save).
constexpr int kPrefetchBlocks = 2;
// How many blocks before an item's end the producer asks L2 for the next
// item's Q tile (persistent kernels).
constexpr int kQueryPrefetchBlocks = 4;
constexpr int kSlotBytes = kBlockKeys * kLatentBytes;  // 41984
constexpr int kPTileBytes = kBlockKeys * 128;          // [64 keys][64 heads] f16

// Shared memory from a 1024-byte aligned base.
constexpr int kQOffset = 0;                               // [9][64 heads][128 B]
constexpr int kRingOffset = kQOffset + 9 * kQChunkBytes;  // [3][64 keys][656 B]
constexpr int kPOffset = (kRingOffset + kSlots * kSlotBytes + 1023) / 1024 * 1024;  // [2] P^T
constexpr int kMiscOffset = kPOffset + 2 * kPTileBytes;

struct Misc {
  uint64_t full[kSlots];   // the producer's 128 threads arrive when their copies land
  uint64_t empty[kSlots];  // the 256 consumer threads arrive when no MMA reads the block
  // Ping-pong consumers (per consumer, 128 arrivals of its threads, or of the
  // other's for free): vote[c] its flag (and maxima) are out, tile[c] its P^T
  // is written, released[c] the other consumer is done with both.
  uint64_t vote[2];
  uint64_t tile[2];
  uint64_t released[2];
  int flag[2];  // [consumer]: its scores passed the running max this bunch
  // [consumer][warp][head]: the running max as each ping-pong warp holds it
  // (the same in all eight; a warp's own copy, written by its g = 0 lanes).
  float warp_max[2][4][kHeads];
  float warp_factor[2][4][kHeads];  // the same copies of exp2(old max - new max) of a move
  float row_max[kHeads];            // the running max of both consumers (log2 units)
  float exchange[2][4][kHeads];     // [consumer][warp][head]: block maxima, then row sums
  float inverse[kHeads];            // the epilogue's 1 / row sum per head
};
constexpr int kSharedBytes = kMiscOffset + static_cast<int>(sizeof(Misc)) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "sparse MLA fp8 ring: shared memory");

// Named barriers (1..15; 0 is __syncthreads), all between the 256 consumer threads.
constexpr int kQueryBarrier = 1;
constexpr int kVoteBarrier = 2;
constexpr int kMaxBarrier = 3;
constexpr int kPBarrier = 4;
constexpr int kSumBarrier = 5;
// The ping-pong consumers' own barriers, + c: between one consumer's 128
// threads, and the turns of the alternating score loops (128 sync + 128 arrive).
constexpr int kOwnVoteBarrier = 6;
constexpr int kOwnMaxBarrier = 8;
constexpr int kTurnBarrier = 10;

// The running max before any valid key: finite, so that a score minus it
// needs no test (a missing key's -inf stays -inf, a valid key passes the
// vote), and exp2 of (it - a real max) is 0.
constexpr float kNoMax = -1e30f;

// 2^x by the SFU (ex2.approx.ftz: 2^-inf = 0; the P values it makes are
// rounded to f16 next).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// True on every participating thread when `value` is on any of the `threads`
// threads reaching barrier `id` (non-aligned: safe from any code).
__device__ __forceinline__ bool any_thread(bool value, int id, int threads) {
  int result;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.b32 q, %1, 0;\n"
      "barrier.cta.red.or.pred p, %2, %3, q;\nselp.b32 %0, 1, 0, p;\n}\n"
      : "=r"(result)
      : "r"(static_cast<int>(value)), "r"(id), "r"(threads)
      : "memory");
  return result != 0;
}

__device__ __forceinline__ void cp_async_16_or_zero(uint32_t destination, const void* source,
                                                    bool copy) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
               "r"(copy ? 16 : 0)
               : "memory");
}
// Arrives on `barrier` once every cp.async this thread issued has landed.
__device__ __forceinline__ void cp_async_arrive(uint64_t* barrier) {
  asm volatile(
      "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(barrier))
      : "memory");
}

// ---- Work items -------------------------------------------------------------
// One CTA runs one (row, head block, split) of the grid, or, persistent (one
// split only), every gridDim.x-th (row, head block) from blockIdx.x: the ring
// then streams on from one row's last block into the next row's first (the
// producer does not wait for the consumers' epilogue), and a row's first
// gathers and the CTA's launch are paid once per SM instead of once per row.
struct WorkItem {
  int64_t row;
  int head0;
};
// The k-th item of this CTA, false past its last; everything but k is
// recomputed from the parameters and the special registers (the consumers
// keep no more live state across a row than before).
template <bool kPersistent>
__device__ __forceinline__ bool work_item(const SparseMlaParams& p, int k, WorkItem& item) {
  if constexpr (kPersistent) {
    const int head_blocks = p.heads / kHeads;
    const int index = static_cast<int>(blockIdx.x) + k * static_cast<int>(gridDim.x);
    if (index >= p.rows * head_blocks) return false;
    item.row = index / head_blocks;
    item.head0 = (index % head_blocks) * kHeads;
    return true;
  } else {
    item.row = blockIdx.x;
    item.head0 = static_cast<int>(blockIdx.y) * kHeads;
    return k == 0;
  }
}

// ---- The producer -----------------------------------------------------------
// Warp w copies keys 16w .. 16w + 15 of every block: lane l the 16-byte chunks
// l and 32 + l (l < 9) of each entry (41 chunks of 656 bytes).
template <typename Addressing, bool kPersistent>
__device__ __forceinline__ void fp8ring_producer(const SparseMlaParams& p, uint8_t* shared) {
  set_max_registers_dec<kProducerRegisters>();
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int producer_thread = static_cast<int>(threadIdx.x) - kConsumerThreads;
  const int warp = producer_thread / 32, lane = producer_thread % 32;
  const BunchRange range = bunch_range(p, kBunchKeys);
  const int begin = range.first * kBunchKeys;
  const int blocks = 2 * range.count;
  const Addressing entry(p);
  const uint32_t ring = shared_address(shared + kRingOffset);
  WorkItem item;
  for (int k = 0; work_item<kPersistent>(p, k, item); ++k) {
    // Blocks issued for earlier items: the ring's position goes on from them.
    const int filled = k * blocks;
    const int32_t* row_slots = p.slots + item.row * p.top_k;
    auto key_slot = [&](int block) -> int32_t {
      const int index = begin + block * kBlockKeys + 16 * warp + lane % 16;
      return block < blocks && index < p.top_k ? row_slots[index] : -1;
    };
    // Blocks 1 .. kPrefetchBlocks - 1 into L2 now, block + kPrefetchBlocks with block.
    for (int ahead = 1; ahead < kPrefetchBlocks; ++ahead) {
      const int32_t slot = key_slot(ahead);
      if (lane < 16 && slot >= 0) prefetch_l2_bulk(entry(slot), kLatentBytes);
    }
    // Persistent: the next item's Q tile into L2 a few blocks before this item
    // ends (the consumers load it right after this item's epilogue; earlier, a
    // large pool's gathers would evict it again). +2% at a 32K prompt, level
    // at 128K and over a 1M pool (H100, fifty-first session).
    WorkItem next;
    const bool has_next = kPersistent && work_item<kPersistent>(p, k + 1, next);
    const int next_query_block = max(0, blocks - kQueryPrefetchBlocks);
#pragma unroll 1
    for (int block = 0; block < blocks; ++block) {
      const int ringed = filled + block;
      const int slot = ringed % kSlots;
      const int32_t near = key_slot(block);
      const int32_t far = key_slot(block + kPrefetchBlocks);
      if (lane < 16 && far >= 0) prefetch_l2_bulk(entry(far), kLatentBytes);
      if (has_next && block == next_query_block && warp == 0 && lane == 0)
        prefetch_l2_bulk(
            reinterpret_cast<const uint8_t*>(p.q + (next.row * p.heads + next.head0) * kDim),
            kHeads * kDim * 2);
      if (ringed >= kSlots) mbarrier_wait(&misc.empty[slot], ((ringed / kSlots) - 1) & 1);
      const uint32_t base = ring + slot * kSlotBytes + 16 * warp * kLatentBytes;
#pragma unroll 4
      for (int k = 0; k < 16; ++k) {
        const int32_t s = __shfl_sync(0xffffffffu, near, k);
        const uint8_t* source = s >= 0 ? entry(s) : p.kv_pool;
        const uint32_t destination = base + k * kLatentBytes;
        cp_async_16_or_zero(destination + 16 * lane, source + 16 * lane, s >= 0);
        if (lane < 9)
          cp_async_16_or_zero(destination + 512 + 16 * lane, source + 512 + 16 * lane, s >= 0);
      }
      cp_async_arrive(&misc.full[slot]);
    }
  }
  // The last copies land before the warp exits.
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// ---- The consumers' stages ----------------------------------------------------
// Thread (consumer c, warp w, lane 4g + t) of a consumer warpgroup. Its score
// accumulators s[4j + 2r + e] are S^T_c[key 16w + g + 8r][head 8j + 2t + e];
// its output accumulators o[32m + 4j + 2r + e] are O^T[dim 256c + 64m + 16w +
// 2g + r][head 8j + 2t + e]; row_sum[2j + e] its keys' share of head 8j + 2t + e.
struct ConsumerThread {
  int tid, c, warp, g, t;
};

// Q [64 heads][576] as f16 x 2^-6 into the 9 swizzled chunks, each 16-dim
// group in the score k-slot order: unit 2u of a chunk holds dims (0, 1, 4, 5,
// 8, 9, 12, 13) of its group u, unit 2u + 1 dims (2, 3, 6, 7, ...). Every load
// of a thread is issued before the first is used (the tile is 72 KB and is the
// CTA's first wait; 9 dependent rounds cost ~8% of the kernel). Ends with a
// barrier of both consumers.
__device__ __forceinline__ void load_query_tile(const SparseMlaParams& p, uint8_t* shared,
                                                int64_t row, int head0, int tid) {
  constexpr int kItems = kHeads * (kDim / 16) / kConsumerThreads;  // 9 groups of 16 dims
  static_assert(kItems * kConsumerThreads == kHeads * (kDim / 16));
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
  // tid made opaque per item: otherwise ptxas keeps the 27 addresses below,
  // invariant over the items, live through the whole row loop (120 bytes of
  // spills in the persistent variant).
  int q_tid = tid;
  asm volatile("" : "+r"(q_tid));
  uint4 loaded[kItems][2];
#pragma unroll
  for (int n = 0; n < kItems; ++n) {
    const int item = q_tid + n * kConsumerThreads;
    const int head = item / (kDim / 16), group = item % (kDim / 16);
    const uint4* source = reinterpret_cast<const uint4*>(q_source + head * kDim + 16 * group);
    loaded[n][0] = source[0];
    loaded[n][1] = source[1];
  }
#pragma unroll
  for (int n = 0; n < kItems; ++n) {
    const int item = q_tid + n * kConsumerThreads;
    const int head = item / (kDim / 16), group = item % (kDim / 16);
    const uint4 low = loaded[n][0], high = loaded[n][1];
    const uint32_t pair[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      h[i] = pack_half2(__uint_as_float(pair[i] << 16) * kQueryPrescale,
                        __uint_as_float(pair[i] & 0xffff0000u) * kQueryPrescale);
    uint8_t* chunk = shared + kQOffset + (group / 4) * kQChunkBytes;
    const int unit = 2 * (group % 4);
    *reinterpret_cast<uint4*>(chunk + swizzled(head, unit)) = make_uint4(h[0], h[2], h[4], h[6]);
    *reinterpret_cast<uint4*>(chunk + swizzled(head, unit + 1)) =
        make_uint4(h[1], h[3], h[5], h[7]);
  }
  for (int head = q_tid; head < kHeads; head += kConsumerThreads) misc.row_max[head] = kNoMax;
  fence_proxy_async_shared();
  named_barrier(kQueryBarrier, kConsumerThreads);
}

// S^T_c = K_c . Q^T for the block in `slot`: 36 wgmma m64n64k16, A built from
// the ring's entries in registers three k-steps deep.
__device__ __forceinline__ void score_mmas(float (&s)[32], float (&o)[128], const uint8_t* ring,
                                           int slot, uint32_t q_address, const ConsumerThread& th) {
  const uint8_t* key_row0 = ring + slot * kSlotBytes + (16 * th.warp + th.g) * kLatentBytes;
  const uint8_t* key_row1 = key_row0 + 8 * kLatentBytes;
  const ScoreScales score_scales = entry_score_scales(key_row0, key_row1);
  auto score_fragment = [&](int ks, uint32_t(&a)[4]) {
    entry_score_fragment(key_row0, key_row1, ks, th.t, score_scales, a);
  };
  uint32_t a[3][4];
  score_fragment(0, a[0]);
  score_fragment(1, a[1]);
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
    wgmma_fence();
    uint32_t q_low = swizzle128_descriptor_low(q_address);
    asm volatile("" : "+r"(q_low));
    q_low += ((ks / 4) * kQChunkBytes + (ks % 4) * 32) >> 4;
    wgmma_m64n64k16_rs<0>(s, a[ks % 3], descriptor_from_words(q_low, kSwizzle128DescriptorHigh),
                          ks > 0);
    wgmma_commit();
    if (ks + 2 < kDim / 16) {
      wgmma_wait<1>();
      score_fragment(ks + 2, a[(ks + 2) % 3]);
    }
  }
  wgmma_wait_all();
#pragma unroll
  for (int i = 0; i < 32; ++i) fence_operand(s[i]);
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(o[i]);
}

// Scores to log2 units; missing slots (-1, past top_k) -inf. `first_key`:
// the block's first key in the row's slots.
__device__ __forceinline__ void scale_and_mask(float (&s)[32], const SparseMlaParams& p,
                                               const int32_t* row_slots, int first_key,
                                               float scale_log2, const ConsumerThread& th) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int index = first_key + 16 * th.warp + th.g + 8 * r;
    const bool valid = index < p.top_k && row_slots[index] >= 0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& value = s[4 * j + 2 * r + e];
        value = valid ? value * scale_log2 : -INFINITY;
      }
  }
}

// This thread's block maxima of heads 8j + 2t + e over its warp's 16 keys,
// into exchange[warp][head] (lanes g = 0).
__device__ __forceinline__ void publish_warp_maxima(const float (&s)[32], float (*exchange)[kHeads],
                                                    const ConsumerThread& th) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float m = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
      if (th.g == 0) exchange[th.warp][8 * j + 2 * th.t + e] = m;
    }
}

// P = exp2(s) (s already relative to the max; exp2(-inf) = 0), its sums, and
// P^T_c: key 16w + g + 8r at its output k-slot row 16w + slot(g + 8r), heads
// 8j + 2t, + 1.
__device__ __forceinline__ void write_p_tile(const float (&s)[32], float (&row_sum)[16],
                                             uint8_t* p_tile, const ConsumerThread& th) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = th.g + 8 * r;
    const int key_row = 16 * th.warp + 2 * (local % 4) + (local / 4) % 2 + 8 * (local / 8);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = fast_exp2(s[4 * j + 2 * r]), p1 = fast_exp2(s[4 * j + 2 * r + 1]);
      row_sum[2 * j] += p0;
      row_sum[2 * j + 1] += p1;
      *reinterpret_cast<uint32_t*>(p_tile + swizzled(key_row, j) + 4 * th.t) = pack_half2(p0, p1);
    }
  }
}

// O^T_c += V^T . P^T over kBlocks blocks of 64 keys: block b's keys in ring
// slot slots[b], its P^T in tile tiles[b]. Step i: block i / 16, key step
// (i % 16) / 4 of it, dim tile m = i % 4 (group 2c + m / 2). The fragments are
// built in order, so the step's scales of both groups, loaded at m = 0, serve
// its four. With two blocks, `release_first` gets this thread's arrival once
// the first block's MMAs are done (step 16 the only one pending).
template <int kBlocks, bool kScalesAhead>
__device__ __forceinline__ void output_mmas(float (&o)[128], const uint8_t* ring,
                                            uint32_t p_address, const int (&slots)[2],
                                            const int (&tiles)[2], uint64_t* release_first,
                                            const ConsumerThread& th) {
  constexpr int kSteps = 16 * kBlocks;
  OutputScales output_scales;
  OutputScaleWords next_scales;
  auto step_keys = [&](int ks) {  // ks: key step over the blocks, 0 .. 4 kBlocks
    return ring + slots[ks / 4] * kSlotBytes + (16 * (ks % 4) + th.t) * kLatentBytes;
  };
  auto output_fragment = [&](int i, uint32_t(&a)[4]) {
    const int ks = i / 4, m = i % 4;
    const uint8_t* keys = step_keys(ks);
    if constexpr (kScalesAhead) {
      // Step ks + 1's scales loaded half a step before they are packed.
      if (m == 0)
        output_scales =
            pack_output_scales(ks == 0 ? entry_output_scale_words(keys, 2 * th.c) : next_scales);
      if (m == 2 && ks + 1 < kSteps / 4)
        next_scales = entry_output_scale_words(step_keys(ks + 1), 2 * th.c);
    } else if (m == 0) {
      output_scales = entry_output_scales(keys, 2 * th.c);
    }
    entry_output_fragment(keys, 256 * th.c + 64 * m + 16 * th.warp + 2 * th.g,
                          output_scales.pair[m / 2], a);
  };
  uint32_t a[3][4];
  output_fragment(0, a[0]);
  output_fragment(1, a[1]);
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const int ks = i / 4, m = i % 4;
    wgmma_fence();
    uint32_t p_low = swizzle128_mn_descriptor_low(p_address, kPTileBytes);
    asm volatile("" : "+r"(p_low));
    p_low += (tiles[ks / 4] * kPTileBytes + (ks % 4) * 16 * 128) >> 4;
    wgmma_m64n64k16_rs<1>(o + 32 * m, a[i % 3],
                          descriptor_from_words(p_low, kSwizzle128DescriptorHigh), 1);
    wgmma_commit();
    if (i + 2 < kSteps) {
      wgmma_wait<1>();
      output_fragment(i + 2, a[(i + 2) % 3]);
    }
    if (kBlocks == 2 && i == 16) mbarrier_arrive(release_first);
  }
  wgmma_wait_all();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(o[i]);
}

// o times exp2(old - new) per head (the running max moved from old to new;
// kNoMax - new: 0).
__device__ __forceinline__ void rescale_output(float (&o)[128], const float (&factor)[16]) {
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) o[32 * m + 4 * j + 2 * r + e] *= factor[2 * j + e];
}

// The row sums over every key, out = O / sum, the lse (misc.row_max holds the
// final max). One thread per head finishes its sum, lse and 1 / sum (the lse's
// log2 and the reciprocal once per head, not on all 256 threads: inlined 16
// times they were most of the epilogue's instruction-cache misses).
template <bool kPersistent>
__device__ __forceinline__ void consumer_epilogue(const SparseMlaParams& p, uint8_t* shared,
                                                  float (&o)[128], float (&row_sum)[16],
                                                  int64_t row, int head0,
                                                  const ConsumerThread& th) {
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int c = th.c, warp = th.warp, g = th.g, t = th.t, tid = th.tid;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v = row_sum[i];
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    row_sum[i] = v;
  }
  named_barrier(kSumBarrier, kConsumerThreads);  // the exchange's last maxima are read
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) misc.exchange[c][warp][8 * j + 2 * t + e] = row_sum[2 * j + e];
  }
  named_barrier(kSumBarrier, kConsumerThreads);
  const bool whole = p.num_splits == 1;
  const int64_t state =
      whole ? row * p.heads + head0 : (row * p.num_splits + blockIdx.z) * p.heads + head0;
  if (tid < kHeads) {
    float total = 0.f;
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int w = 0; w < 4; ++w) total += misc.exchange[x][w][tid];
    misc.inverse[tid] = total > 0.f ? 1.f / total : 0.f;
    const float lse = total > 0.f ? (misc.row_max[tid] + log2f(total)) * kLn2 : -INFINITY;
    (whole ? p.lse : p.partial_lse)[state + tid] = lse;
  }
  named_barrier(kSumBarrier, kConsumerThreads);
  // Thread's values: O^T[dims 256c + 64m + 16w + 2g + r][head 8j + 2t + e] =
  // o[32m + 4j + 2r + e].
  if (whole) {
    // bf16 rows [64 heads][512] staged in the ring (every block is consumed
    // and every copy has landed) or, persistent, where Q was (64 of its 72
    // KB: every score MMA has read it, and the ring may already hold the next
    // row's blocks); 16-byte unit u of head h at unit u ^ (h & 7) (the 8 g
    // lanes x 4 t heads of a store hit 32 banks), then copied out in 16-byte
    // units.
    static_assert(kHeads * 1024 <= 9 * kQChunkBytes, "the staged rows fit the Q tile's space");
    uint8_t* staged = kPersistent ? shared + kQOffset : shared + kRingOffset;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int head = 8 * j + 2 * t + e;
        const float inverse = misc.inverse[head];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int byte = 2 * (256 * c + 64 * m + 16 * warp + 2 * g);
          *reinterpret_cast<uint32_t*>(staged + head * 1024 + ((byte >> 4) ^ (head & 7)) * 16 +
                                       (byte & 15)) =
              pack_bf16x2(o[32 * m + 4 * j + e] * inverse, o[32 * m + 4 * j + 2 + e] * inverse);
        }
      }
    named_barrier(kSumBarrier, kConsumerThreads);
    uint4* out = reinterpret_cast<uint4*>(p.out + state * kLatentRank);
#pragma unroll 4
    for (int unit = tid; unit < kHeads * 64; unit += kConsumerThreads) {
      const int head = unit / 64, u = unit % 64;
      out[unit] = *reinterpret_cast<const uint4*>(staged + head * 1024 + (u ^ (head & 7)) * 16);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int head = 8 * j + 2 * t + e;
        const float inverse = misc.inverse[head];
        float* out = p.partial_out + (state + head) * kLatentRank + 256 * c + 16 * warp + 2 * g;
#pragma unroll
        for (int m = 0; m < 4; ++m)
          *reinterpret_cast<float2*>(out + 64 * m) =
              make_float2(o[32 * m + 4 * j + e] * inverse, o[32 * m + 4 * j + 2 + e] * inverse);
      }
  }
  // The next item's Q overwrites the staged rows: every copy-out has read them.
  if constexpr (kPersistent) named_barrier(kSumBarrier, kConsumerThreads);
}

}  // namespace megactx::cuda::fp8ring
