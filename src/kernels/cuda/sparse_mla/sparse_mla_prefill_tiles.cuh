// The tiles of the wgmma sparse MLA prefill kernel (sparse_mla_prefill.cu):
// the wgmma shapes, the shared-memory layout of a CTA (one query row x 64
// heads: Q, a ring of two stages of two K blocks of 32 keys, P, the row
// statistics), the gather of a warp's keys from the paged fp8 pool into an
// f16 K block, and the split rule and launch that the layouts working in
// 128-key bunches share (the fp8 ring). Only for .cu files.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/sparse_mla/latent_convert.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::cuda::sparse_mla_prefill {

// D[64 x 32] (+)= A[64 x 16] * B[16 x 32], f16 in, fp32 accumulate, both from
// shared memory, K-major (`a`, `b` their descriptors). accumulate == 0 ignores
// D's old value. Thread (warp w, lane g*4+t): d[4j + 2r + e] = D[16w + g + 8r][8j + 2t + e].
__device__ __forceinline__ void wgmma_m64n32k16_f16_ss(float (&d)[16], uint64_t a, uint64_t b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " MEGACTX_WGMMA_D16_TEXT
      ", "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : MEGACTX_WGMMA_D16(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 256] (+)= A[64 x 16] * B[16 x 256], f16 in, fp32 accumulate; A from
// shared memory K-major, B from shared memory MN-major (imm-trans-b = 1: the
// latent rows read as V without a transpose). Same accumulator layout, j < 32.
__device__ __forceinline__ void wgmma_m64n256k16_f16_ss_tb(float (&d)[128], uint64_t a, uint64_t b,
                                                           int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " MEGACTX_WGMMA_D128_TEXT
      ", "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : MEGACTX_WGMMA_D128(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 128] += A[64 x 16] * B[16 x 128] at d[0 .. 64), B MN-major as
// above: half of the m64n256 PV, for launches whose register cap (128 at 512
// threads) is below what an m64n256 instruction needs.
__device__ __forceinline__ void wgmma_m64n128k16_f16_ss_tb(float* d, uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MEGACTX_WGMMA_D64_TEXT
      ", %64, %65, p, 1, 1, 0, 1;\n}\n"
      : MEGACTX_WGMMA_D64(d)
      : "l"(a), "l"(b));
}

constexpr int kHeads = kSparseMlaHeadBlock;       // 64
constexpr int kDim = kSparseMlaQueryDim;          // 576
constexpr int kKeys = kSparseMlaPrefillKeyBlock;  // 32 keys per block, two blocks per stage
constexpr int kChunks = kDim / 64;                // column chunks of 64 f16 = one 128-byte row
constexpr int kQChunkBytes = kHeads * 128;        // 8192
constexpr int kKChunkBytes = kKeys * 128;         // 4096
constexpr int kBuffers = 4;                       // 2 stages x 2 blocks
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kQueryPrescale = 1.f / 64.f;
constexpr float kRescaleSlack = 8.f;  // log2 units: P < 256

// Shared memory, offsets from a 1024-byte aligned base (the swizzle atoms).
constexpr int kQOffset = 0;                                  // [9][64 heads][128 B]
constexpr int kKOffset = kQOffset + kChunks * kQChunkBytes;  // [4][9][32 keys][128 B]
constexpr int kKBytes = kChunks * kKChunkBytes;              // 36864 per block
constexpr int kPOffset = kKOffset + kBuffers * kKBytes;      // [64 heads][128 B]: P of both blocks
constexpr int kMiscOffset = kPOffset + kHeads * 128;

struct Misc {
  float row_max[2][kHeads];  // [warpgroup][head]: the block maxima, exchanged every stage
  float row_sum[2][kHeads];  // [warpgroup][head]: the final sums
  // Bit k of buffer b (byte i for keys 8i .. 8i + 7, written by the warp that
  // gathered them): key k's slot is a real entry (not -1, not past top_k).
  alignas(4) uint8_t valid_bits[kBuffers][4];
};
constexpr int kSharedBytes = kMiscOffset + static_cast<int>(sizeof(Misc)) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "sparse MLA prefill: shared memory");

// Byte offset of 16-byte unit `unit` (0..7) of row `row` in a 128-byte-swizzled tile.
__device__ __forceinline__ int swizzled(int row, int unit) {
  return row * 128 + ((unit ^ (row & 7)) << 4);
}

// The split of the layouts that take a row's slots in bunches of
// `bunch_keys` (the fp8-ring layout): this CTA (blockIdx.z of
// num_splits) takes bunches [first, first + count), ceil(bunches / num_splits)
// each (the host launches no split without a bunch: sparse_mla_bunch_splits).
struct BunchRange {
  int first, count;
};
__device__ __forceinline__ BunchRange bunch_range(const SparseMlaParams& p, int bunch_keys) {
  const int all = (p.top_k + bunch_keys - 1) / bunch_keys;
  const int per_split = (all + p.num_splits - 1) / p.num_splits;
  const int first = static_cast<int>(blockIdx.z) * per_split;
  return {first, min(per_split, all - first)};
}

// The launch of a bunch layout's kernel, kDevice (a device pool) or kTiered
// (slots past pool_slots: a host tier), `threads` x `shared_bytes` per CTA,
// grid rows x head blocks x splits (whole bunches per split, none empty:
// fewer splits than asked for when they do not divide; the partial buffers
// hold num_splits), then the split merge. persistent_ctas > 0 (persistent
// kernels, one split): a grid of at most that many CTAs over the rows x head
// blocks instead, each CTA taking every gridDim.x-th.
template <auto kDevice, auto kTiered>
void launch_bunch_layout(const SparseMlaParams& requested, int threads, int shared_bytes,
                         cudaStream_t stream, int persistent_ctas = 0) {
  if (requested.rows == 0) return;
  SparseMlaParams params = requested;
  params.num_splits = detail::sparse_mla_bunch_splits(requested.num_splits, requested.top_k);
  static const bool configured = [shared_bytes] {
    for (auto kernel : {kDevice, kTiered})
      MEGACTX_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    return true;
  }();
  (void)configured;
  const int64_t items = int64_t{params.rows} * (params.heads / kHeads);
  const dim3 grid =
      persistent_ctas > 0
          ? dim3(static_cast<unsigned>(std::min<int64_t>(items, persistent_ctas)), 1, 1)
          : dim3(static_cast<unsigned>(params.rows), static_cast<unsigned>(params.heads / kHeads),
                 static_cast<unsigned>(params.num_splits));
  const bool tiered = params.pool_slots != INT64_MAX;
  launch_kernel(tiered ? kTiered : kDevice, grid, threads, shared_bytes, stream, params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  if (params.num_splits > 1) detail::launch_sparse_mla_merge(params, stream);
}

// Q [64 heads][576] of (row, head0) as f16 times kQueryPrescale into the 9
// swizzled chunks of `q_tile` ([9][64 heads][128 B]), by threads 0 .. kThreads
// - 1 (tid): 4608 16-byte units, loaded in two batches so that half of each
// thread's loads are in flight at once.
template <int kThreads>
__device__ __forceinline__ void store_query_tile(const SparseMlaParams& p, int64_t row, int head0,
                                                 uint8_t* q_tile, int tid) {
  const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
  constexpr int kUnitsPerHead = kDim / 8;                        // 72
  constexpr int kPerThread = kHeads * kUnitsPerHead / kThreads;  // 18 at 256 threads
  static_assert(kPerThread % 2 == 0 && kPerThread * kThreads == kHeads * kUnitsPerHead);
#pragma unroll
  for (int batch = 0; batch < 2; ++batch) {
    uint4 raw[kPerThread / 2];
#pragma unroll
    for (int r = 0; r < kPerThread / 2; ++r) {
      const int i = tid + (batch * kPerThread / 2 + r) * kThreads;
      raw[r] = *reinterpret_cast<const uint4*>(q_source + (i / kUnitsPerHead) * kDim +
                                               (i % kUnitsPerHead) * 8);
    }
#pragma unroll
    for (int r = 0; r < kPerThread / 2; ++r) {
      const int i = tid + (batch * kPerThread / 2 + r) * kThreads;
      const int head = i / kUnitsPerHead, unit = i % kUnitsPerHead;
      store_bf16x8_as_half(
          raw[r], kQueryPrescale,
          reinterpret_cast<__half*>(q_tile + (unit / 8) * kQChunkBytes + swizzled(head, unit % 8)));
    }
  }
}

// A consumer warpgroup's epilogue: its rows head_low and head_low + 8 (of 64
// heads from head0) of O, o[4j + 2r + e] = O[row r][256 c + 8j + 2t + e]
// (fp32, not normalised), divided by the rows' softmax sums (each thread's
// running_sum over its columns, added over the quad and over both
// warpgroups in `row_sum` [warpgroup][head], behind named barrier `barrier`
// of both warpgroups), with their lse from the log2-domain running max: to
// out / lse with one split, else the split's (blockIdx.z) normalised state
// for the merge (sparse_mla_attention.cu's layout).
__device__ __forceinline__ void store_consumer_rows(const SparseMlaParams& p, const float* o,
                                                    float (&running_sum)[2],
                                                    const float (&running_max)[2],
                                                    float (&row_sum)[2][kHeads], int barrier,
                                                    int64_t row, int head0, int head_low, int c,
                                                    int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    running_sum[r] += __shfl_xor_sync(0xffffffffu, running_sum[r], 1);
    running_sum[r] += __shfl_xor_sync(0xffffffffu, running_sum[r], 2);
    if (t == 0) row_sum[c][head_low + 8 * r] = running_sum[r];
  }
  named_barrier(barrier, 256);
  float total[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    total[r] = row_sum[0][head_low + 8 * r] + row_sum[1][head_low + 8 * r];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = head_low + 8 * r;
    const float inverse = total[r] > 0.f ? 1.f / total[r] : 0.f;
    const float lse = total[r] > 0.f ? (running_max[r] + log2f(total[r])) * kLn2 : -INFINITY;
    if (p.num_splits == 1) {
      uint16_t* out = p.out + (row * p.heads + head0 + head) * kLatentRank + 256 * c + 2 * t;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            pack_bf16x2(o[4 * j + 2 * r] * inverse, o[4 * j + 2 * r + 1] * inverse);
      if (c == 0 && t == 0) p.lse[row * p.heads + head0 + head] = lse;
    } else {
      const int64_t state = (row * p.num_splits + blockIdx.z) * p.heads + head0 + head;
      float* out = p.partial_out + state * kLatentRank + 256 * c + 2 * t;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(out + 8 * j) =
            make_float2(o[4 * j + 2 * r] * inverse, o[4 * j + 2 * r + 1] * inverse);
      if (c == 0 && t == 0) p.partial_lse[state] = lse;
    }
  }
}

// 16 e4m3 (latent dims 8 u .. 8 u + 16 of a chunk, u even) times `scale` as
// f16 into units u and u + 1 of row `key` of a swizzled chunk. With `odd`
// (lanes of odd chunks: first_unit = u + 1) the word's high half is stored
// first, so that the 8 lanes of each store phase write 8 distinct 16-byte
// columns of one row (no bank conflicts); otherwise first_unit = u.
__device__ __forceinline__ void store_e4m3x16_swizzled(const uint4& bytes, __half2 scale,
                                                       uint8_t* chunk, int key, int first_unit,
                                                       bool odd) {
  const uint32_t first[2] = {odd ? bytes.z : bytes.x, odd ? bytes.w : bytes.y};
  const uint32_t second[2] = {odd ? bytes.x : bytes.z, odd ? bytes.y : bytes.w};
  uint32_t packed[8];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    e4m3x4_scaled_to_half2(first[w], scale, packed[2 * w], packed[2 * w + 1]);
    e4m3x4_scaled_to_half2(second[w], scale, packed[4 + 2 * w], packed[4 + 2 * w + 1]);
  }
  *reinterpret_cast<uint4*>(chunk + swizzled(key, first_unit)) =
      make_uint4(packed[0], packed[1], packed[2], packed[3]);
  *reinterpret_cast<uint4*>(chunk + swizzled(key, first_unit ^ 1)) =
      make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// A warp's share of a K block in registers: a group of 4 keys of the block.
// Each load instruction reads one key's consecutive bytes with the 32 lanes
// (whole 128-byte lines: ~4 L1 wavefronts per instruction; one key per lane
// took 32, and ncu found L1 78% busy).
constexpr int kGroupKeys = 4;
struct WarpEntries {
  uint4 latent[kGroupKeys];    // key j: latent bytes 16 lane .. 16 lane + 16 (e4m3 dims 16 lane ..)
  uint4 rope[kGroupKeys / 4];  // key 4h + lane / 8: rope bytes 16 (lane % 8) .. + 16 (8 bf16)
  float scale;                 // key (lane / 4) % kGroupKeys: the scale of group lane % 4
  int32_t slot;                // key lane % kGroupKeys (-1: none)
};

// Missing slots load as zeros: the dequantised row is then exactly 0 (P is 0
// there too, and 0 x NaN of a stale value would poison O). The slot shuffles
// all go first, so that the loads issue back to back. `slot` is lane % kGroupKeys's.
// Addressing: LatentAddressing, or DeviceLatentAddressing without a host tier.
template <typename Addressing = LatentAddressing>
__device__ __forceinline__ void load_warp_entries(WarpEntries& e, const SparseMlaParams& p,
                                                  int32_t slot, int lane) {
  const Addressing entry(p);  // from the kernel parameters at each use: no registers held
  constexpr unsigned kAll = 0xffffffffu;
  e.slot = slot;
  int32_t key_slot[kGroupKeys], rope_slot[kGroupKeys / 4];
#pragma unroll
  for (int j = 0; j < kGroupKeys; ++j) key_slot[j] = __shfl_sync(kAll, slot, j);
#pragma unroll
  for (int h = 0; h < kGroupKeys / 4; ++h) rope_slot[h] = __shfl_sync(kAll, slot, 4 * h + lane / 8);
  const int32_t scale_slot = __shfl_sync(kAll, slot, (lane / 4) % kGroupKeys);
#pragma unroll
  for (int j = 0; j < kGroupKeys; ++j)
    e.latent[j] =
        load_or_zero(entry(key_slot[j] < 0 ? 0 : key_slot[j]) + 16 * lane, key_slot[j] >= 0);
#pragma unroll
  for (int h = 0; h < kGroupKeys / 4; ++h)
    e.rope[h] = load_or_zero(
        entry(rope_slot[h] < 0 ? 0 : rope_slot[h]) + kLatentRopeOffset + 16 * (lane % 8),
        rope_slot[h] >= 0);
  e.scale =
      load_or_zero_f32(entry(scale_slot < 0 ? 0 : scale_slot) + kLatentScaleOffset + 4 * (lane % 4),
                       scale_slot >= 0);
}

// The warp's keys as f16 into rows key0 .. key0 + 3 of a K block (9
// swizzled chunks). A lane's 16 latent dims are units 2(lane % 4) and + 1 of
// chunk lane / 4; lanes of odd chunks store their odd unit first, so that the
// 8 lanes of each store phase write 8 distinct units of one row (no conflicts).
__device__ __forceinline__ void store_warp_entries(const WarpEntries& e, uint8_t* tile, int key0,
                                                   int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const int chunk = lane / 4;
  const bool odd = (chunk & 1) != 0;
  const int first_unit = 2 * (lane % 4) + (odd ? 1 : 0);
  uint8_t* latent_chunk = tile + chunk * kKChunkBytes;
  // The scales of the lane's group for the keys, shuffled before any use
  // (each conversion waiting on its own shuffle left the warp idle).
  float key_scale[kGroupKeys];
#pragma unroll
  for (int j = 0; j < kGroupKeys; ++j) key_scale[j] = __shfl_sync(kAll, e.scale, 4 * j + lane / 8);
#pragma unroll
  for (int j = 0; j < kGroupKeys; ++j) {
    const int key = key0 + j;
    const __half2 scale = __float2half2_rn(key_scale[j]);
    store_e4m3x16_swizzled(e.latent[j], scale, latent_chunk, key, first_unit, odd);
  }
  // Rope dims 512 + 8u .. + 8 (u = lane % 8): chunk 8, unit u of the key's row.
  uint8_t* rope_chunk = tile + 8 * kKChunkBytes;
#pragma unroll
  for (int h = 0; h < kGroupKeys / 4; ++h)
    store_bf16x8_as_half(
        e.rope[h], 1.f,
        reinterpret_cast<__half*>(rope_chunk + swizzled(key0 + 4 * h + lane / 8, lane % 8)));
}

}  // namespace megactx::cuda::sparse_mla_prefill
