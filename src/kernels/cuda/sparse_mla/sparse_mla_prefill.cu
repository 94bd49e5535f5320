// Sparse MLA for many query rows (prefill, long verification batches) on
// Hopper warpgroup MMAs (wgmma, sm_90a). One CTA = one query row x 64 heads
// over all of its top-k slots (no split: prefill has rows enough to fill the
// GPU), two warpgroups that both gather and compute:
//
//   gather: each stage is two blocks of 32 keys, warpgroup c loads block c's
//     656-byte fp8 entries from the paged pool (warp w keys 8w .. 8w + 7, one
//     key per load instruction across the 32 lanes), one stage ahead, and
//     dequantises them to f16 (e4m3 -> f16 exact, the group scale one f16
//     multiply, rope bf16 -> f16) into a K block of 32 keys x 576 in the
//     128-byte swizzle layout; two stages in a ring;
//   compute, stage after stage, warpgroup c on block c of the stage:
//       S_c[64 heads][32]  = Q[64][576] . K_c^T          (36 wgmma m64n32k16)
//       row maxima exchanged in shared memory, so both share one running max;
//       P_c = exp2(S_c - max) written to its half of P[64][64] (f16, swizzled);
//       O_c[64][256]      += P[64][64] . [K_0; K_1][:, 256c .. 256c+256)
//                                                           (4 wgmma m64n256k16)
//     i.e. each consumer computes the scores of its own block and the output
//     columns of its half of the latent over both blocks (FlashMLA's split of
//     the work between two warpgroups), so no MMA is done twice. K doubles as
//     V (the value is the latent itself), read MN-major by the PV MMA.
//
// Q is stored as f16 times 2^-6 (|q| up to 4e6 fits f16), folded back into the
// softmax scale; the online softmax runs in the log2 domain. The results are
// the general kernel's (sparse_mla_attention.cu) up to summation order.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/sparse_mla/latent_convert.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::cuda {
namespace {

// D[64 x 32] (+)= A[64 x 16] * B[16 x 32], f16 in, fp32 accumulate, both from
// shared memory, K-major (`a`, `b` their descriptors). accumulate == 0 ignores
// D's old value. Thread (warp w, lane g*4+t): d[4j + 2r + e] = D[16w + g + 8r][8j + 2t + e].
__device__ __forceinline__ void wgmma_m64n32k16_f16_ss(float (&d)[16], uint64_t a, uint64_t b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 256] (+)= A[64 x 16] * B[16 x 256], f16 in, fp32 accumulate; A from
// shared memory K-major, B from shared memory MN-major (imm-trans-b = 1: the
// latent rows read as V without a transpose). Same accumulator layout, j < 32.
__device__ __forceinline__ void wgmma_m64n256k16_f16_ss_tb(float (&d)[128], uint64_t a, uint64_t b,
                                                           int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
      "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, "
      "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, "
      "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(accumulate));
}

constexpr int kThreads = 256;  // two warpgroups; 255 registers each (no producer warpgroup:
                               // ptxas allocates every path of a kernel within one cap, and
                               // 128 output + 16 score accumulators do not fit 384 threads' 168)
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
  // Bit k of buffer b (byte w written by warp w): key k's slot is a real entry
  // (not -1, not past top_k).
  alignas(4) uint8_t valid_bits[kBuffers][4];
};
constexpr int kSharedBytes = kMiscOffset + static_cast<int>(sizeof(Misc)) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "sparse MLA prefill: shared memory");

constexpr int kExchangeBarrier = 1;  // named barriers of both warpgroups
constexpr int kProbBarrier = 2;
constexpr int kBlockBarrier = 3;  // + warpgroup: its own K block is written

// Byte offset of 16-byte unit `unit` (0..7) of row `row` in a 128-byte-swizzled tile.
__device__ __forceinline__ int swizzled(int row, int unit) {
  return row * 128 + ((unit ^ (row & 7)) << 4);
}

// A warp's share of a K block in registers: 8 keys (8w .. 8w + 7 of the
// block, warp w of the warpgroup). Each load instruction reads one key's
// consecutive bytes with the 32 lanes (whole 128-byte lines: ~4 L1 wavefronts
// per instruction; one key per lane took 32, and ncu found L1 78% busy).
struct WarpEntries {
  uint4 latent[8];  // key j: latent bytes 16 lane .. 16 lane + 16 (e4m3 dims 16 lane ..)
  uint4 rope[2];    // key 4h + lane / 8: rope bytes 16 (lane % 8) .. + 16 (8 bf16)
  float scale;      // key lane / 4: the scale of group lane % 4
  int32_t slot;     // key lane % 8 (-1: none)
};

// Missing slots load as zeros: the dequantised row is then exactly 0 (P is 0
// there too, and 0 x NaN of a stale value would poison O). The slot shuffles
// all go first, so that the loads issue back to back.
__device__ __forceinline__ void load_warp_entries(WarpEntries& e, const SparseMlaParams& p,
                                                  int32_t slot, int lane) {
  const LatentAddressing entry(p);  // from the kernel parameters at each use: no registers held
  constexpr unsigned kAll = 0xffffffffu;
  e.slot = slot;
  int32_t key_slot[8], rope_slot[2];
#pragma unroll
  for (int j = 0; j < 8; ++j) key_slot[j] = __shfl_sync(kAll, slot, j);
#pragma unroll
  for (int h = 0; h < 2; ++h) rope_slot[h] = __shfl_sync(kAll, slot, 4 * h + lane / 8);
  const int32_t scale_slot = __shfl_sync(kAll, slot, lane / 4);
#pragma unroll
  for (int j = 0; j < 8; ++j)
    e.latent[j] =
        load_or_zero(entry(key_slot[j] < 0 ? 0 : key_slot[j]) + 16 * lane, key_slot[j] >= 0);
#pragma unroll
  for (int h = 0; h < 2; ++h)
    e.rope[h] = load_or_zero(
        entry(rope_slot[h] < 0 ? 0 : rope_slot[h]) + kLatentRopeOffset + 16 * (lane % 8),
        rope_slot[h] >= 0);
  e.scale =
      load_or_zero_f32(entry(scale_slot < 0 ? 0 : scale_slot) + kLatentScaleOffset + 4 * (lane % 4),
                       scale_slot >= 0);
}

// The warp's 8 keys as f16 into rows 8w .. 8w + 7 of a K block (9 swizzled
// chunks). A lane's 16 latent dims are units 2(lane % 4) and + 1 of chunk
// lane / 4; lanes of odd chunks store their odd unit first, so that the 8
// lanes of each store phase write 8 distinct units of one row (no conflicts).
__device__ __forceinline__ void store_warp_entries(const WarpEntries& e, uint8_t* tile, int warp,
                                                   int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const int chunk = lane / 4;
  const bool odd = (chunk & 1) != 0;
  const int first_unit = 2 * (lane % 4) + (odd ? 1 : 0), second_unit = first_unit ^ 1;
  uint8_t* latent_chunk = tile + chunk * kKChunkBytes;
  // The scales of the lane's group for the 8 keys, shuffled before any use
  // (each conversion waiting on its own shuffle left the warp idle).
  float key_scale[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) key_scale[j] = __shfl_sync(kAll, e.scale, 4 * j + lane / 8);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int key = 8 * warp + j;
    const __half2 scale = __float2half2_rn(key_scale[j]);
    // The 8 dims of the first store: the low half of the word (even chunks)
    // or the high half (odd chunks).
    const uint32_t first[2] = {odd ? e.latent[j].z : e.latent[j].x,
                               odd ? e.latent[j].w : e.latent[j].y};
    const uint32_t second[2] = {odd ? e.latent[j].x : e.latent[j].z,
                                odd ? e.latent[j].y : e.latent[j].w};
    uint32_t packed[8];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      e4m3x4_scaled_to_half2(first[w], scale, packed[2 * w], packed[2 * w + 1]);
      e4m3x4_scaled_to_half2(second[w], scale, packed[4 + 2 * w], packed[4 + 2 * w + 1]);
    }
    *reinterpret_cast<uint4*>(latent_chunk + swizzled(key, first_unit)) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
    *reinterpret_cast<uint4*>(latent_chunk + swizzled(key, second_unit)) =
        make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
  // Rope dims 512 + 8u .. + 8 (u = lane % 8): chunk 8, unit u of the key's row.
  uint8_t* rope_chunk = tile + 8 * kKChunkBytes;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    store_bf16x8_as_half(
        e.rope[h], 1.f,
        reinterpret_cast<__half*>(rope_chunk + swizzled(8 * warp + 4 * h + lane / 8, lane % 8)));
}

// The kernel's body for warpgroup C. Each warpgroup runs its own copy with its
// index a constant, so that the shared-memory addresses and wgmma descriptors
// it builds are warp-uniform to the compiler (uniform registers instead of
// per-stage register-to-uniform moves; the same change took the fused
// indexer from 586 to 627 TFLOP/s).
template <int C>
__device__ __forceinline__ void sparse_mla_prefill_warpgroup(const SparseMlaParams& p,
                                                             uint8_t* shared) {
  uint8_t* q_tile = shared + kQOffset;
  uint8_t* k_tiles = shared + kKOffset;
  uint8_t* p_tile = shared + kPOffset;
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);

  const int tid = static_cast<int>(threadIdx.x);
  const int c = C;  // warpgroup: its block of each stage, and its half of the latent
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row = blockIdx.x;
  const int head0 = static_cast<int>(blockIdx.y) * kHeads;
  const int blocks = (p.top_k + kKeys - 1) / kKeys;
  const int stages = (blocks + 1) / 2;
  const int32_t* row_slots = p.slots + row * p.top_k;
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;

  // The gather: warpgroup c writes block c of every stage (so its own score
  // MMA needs only its own barrier), warp w of it keys 8w .. 8w + 7.
  auto slot_of = [&](int stage) -> int32_t {
    const int index = (2 * stage + c) * kKeys + 8 * warp + lane % 8;
    return stage < stages && index < p.top_k ? row_slots[index] : -1;
  };
  // Slot ids two stages ahead of the entries, entries one stage ahead of their
  // conversion: the global round trips overlap the MMAs of the stage before.
  int32_t slot_next = slot_of(0), slot_after = slot_of(1);
  WarpEntries pending;
  auto fetch_next = [&](int stage) {
    load_warp_entries(pending, p, slot_next, lane);
    slot_next = slot_after;
    slot_after = slot_of(stage + 2);
  };
  auto convert_pending = [&](int stage) {
    const int buffer = 2 * (stage & 1) + c;
    store_warp_entries(pending, k_tiles + buffer * kKBytes, warp, lane);
    const unsigned valid = __ballot_sync(0xffffffffu, pending.slot >= 0) & 0xffu;
    if (lane == 0) misc.valid_bits[buffer][warp] = static_cast<uint8_t>(valid);
  };
  fetch_next(0);

  // Q [64 heads][576] bf16 -> f16 x 2^-6, swizzled chunks: 4608 16-byte units, 18 per thread.
  {
    const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
    constexpr int kUnitsPerHead = kDim / 8;                        // 72
    constexpr int kPerThread = kHeads * kUnitsPerHead / kThreads;  // 18
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
        store_bf16x8_as_half(raw[r], kQueryPrescale,
                             reinterpret_cast<__half*>(q_tile + (unit / 8) * kQChunkBytes +
                                                       swizzled(head, unit % 8)));
      }
    }
  }
  convert_pending(0);
  if (stages > 1) fetch_next(1);
  fence_proxy_async_shared();  // st.shared -> the wgmma operand reads (async proxy)
  __syncthreads();

  const uint32_t q_address = shared_address(q_tile);
  const uint32_t k_address = shared_address(k_tiles);
  const uint32_t p_address = shared_address(p_tile);
  float s[16];
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    o[i] = 0.f;
    fence_operand(o[i]);
  }
  float running_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8 of this warp's 16 heads
  float running_sum[2] = {0.f, 0.f};              // this thread's columns only (reduced at the end)

  // S_c of a stage: 36 k-steps of 16 over Q's and the block's 9 swizzled
  // chunks. The descriptors' low words are 32-bit adds to a base the compiler
  // cannot see through (else it hoists all 72 descriptors out of the stage
  // loop into registers); a runtime loop over the chunks instead made ptxas
  // wait for every wgmma.
  auto issue_scores = [&](int stage) {
    uint32_t q_low = swizzle128_descriptor_low(q_address);
    asm volatile("" : "+r"(q_low));
    const uint32_t k_low = swizzle128_descriptor_low(k_address + (2 * (stage & 1) + c) * kKBytes);
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      const uint32_t column = ks / 4, step = (ks % 4) * 32;
      wgmma_m64n32k16_f16_ss(s,
                             descriptor_from_words(q_low + ((column * kQChunkBytes + step) >> 4),
                                                   kSwizzle128DescriptorHigh),
                             descriptor_from_words(k_low + ((column * kKChunkBytes + step) >> 4),
                                                   kSwizzle128DescriptorHigh),
                             ks > 0);
    }
    wgmma_commit();
  };

  const int head_low = warp * 16 + g;
  issue_scores(0);
  for (int stage = 0; stage < stages; ++stage) {
    const int ring = stage & 1;
    wgmma_wait_all();  // S of this stage, and the PV of the last one
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // Scale and mask (into a copy: the accumulator registers are written by
    // wgmma only); the block maxima of rows g and g + 8, shared with the other warpgroup.
    float score[16];
    const uint32_t valid = *reinterpret_cast<const uint32_t*>(misc.valid_bits[2 * ring + c]);
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = score[4 * j + 2 * r + e];
          value =
              (valid >> (8 * j + 2 * t + e)) & 1u ? s[4 * j + 2 * r + e] * scale_log2 : -INFINITY;
          block_max[r] = fmaxf(block_max[r], value);
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      if (t == 0) misc.row_max[c][head_low + 8 * r] = block_max[r];
    }
    named_barrier(kExchangeBarrier, kThreads);
    // The running max moves only when a block's max passes it by more than
    // kRescaleSlack (log2 units), FlashAttention-4's lazy rescaling: P stays
    // below 2^kRescaleSlack (f16 holds it as precisely as values below 1) and
    // the sums are fp32. Both warpgroups decide from the same values, so they
    // keep the same max.
    float factor[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float other = misc.row_max[c ^ 1][head_low + 8 * r];
      const float stage_max = fmaxf(block_max[r], other);
      const bool raise = stage_max > running_max[r] + kRescaleSlack;
      const float new_max = raise ? stage_max : running_max[r];
      factor[r] = raise ? exp2f(running_max[r] - new_max) : 1.f;  // -inf - x: 0
      const bool empty = new_max == -INFINITY;  // nothing valid yet: avoid inf - inf
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = score[4 * j + 2 * r + e];
          value = empty ? 0.f : exp2f(value - new_max);
          sum += value;
        }
      running_sum[r] = running_sum[r] * factor[r] + sum;
      running_max[r] = new_max;
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 0] *= factor[0];
      o[4 * j + 1] *= factor[0];
      o[4 * j + 2] *= factor[1];
      o[4 * j + 3] *= factor[1];
    }
    // P_c -> columns 32c .. 32c + 32 of P (f16, K-major, swizzled): unit 4c + j.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(p_tile + swizzled(head_low + 8 * r, 4 * c + j) + 4 * t) =
            pack_half2(score[4 * j + 2 * r], score[4 * j + 2 * r + 1]);
    fence_proxy_async_shared();
    named_barrier(kProbBarrier, kThreads);
    // The rescaled O must be in its registers before the MMAs that accumulate
    // into it are issued (else ptxas serialises every wgmma of the kernel).
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // O_c += P . V: keys 0-31 from block 0's buffer, 32-63 from block 1's;
    // latent columns 256c .. 256c + 256 = chunks 4c .. 4c + 3.
    wgmma_fence();
    const uint32_t p_low = swizzle128_descriptor_low(p_address);
    const uint32_t v_low = swizzle128_mn_descriptor_low(
        k_address + 2 * ring * kKBytes + 4 * c * kKChunkBytes, kKChunkBytes);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_f16_ss_tb(
          o, descriptor_from_words(p_low + 2 * ks, kSwizzle128DescriptorHigh),
          descriptor_from_words(v_low + (((ks / 2) * kKBytes + (ks % 2) * 16 * 128) >> 4),
                                kSwizzle128DescriptorHigh),
          1);
    wgmma_commit();
    if (stage + 1 < stages) {
      // The next stage's block goes where the last stage's was (its PV is done),
      // while this PV runs; then its scores; then the entries after it are fetched.
      convert_pending(stage + 1);
      fence_proxy_async_shared();
      named_barrier(kBlockBarrier + c, 128);
      issue_scores(stage + 1);
      if (stage + 2 < stages) fetch_next(stage + 2);
    }
  }
  wgmma_wait_all();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // Finalise: the row sums of both warpgroups, then out = O / sum and the lse.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    running_sum[r] += __shfl_xor_sync(0xffffffffu, running_sum[r], 1);
    running_sum[r] += __shfl_xor_sync(0xffffffffu, running_sum[r], 2);
    if (t == 0) misc.row_sum[c][head_low + 8 * r] = running_sum[r];
  }
  named_barrier(kExchangeBarrier, kThreads);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = head_low + 8 * r;
    const float total = misc.row_sum[0][head] + misc.row_sum[1][head];
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    uint16_t* out = p.out + (row * p.heads + head0 + head) * kLatentRank + 256 * c + 2 * t;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<uint32_t*>(out + 8 * j) =
          pack_bf16x2(o[4 * j + 2 * r] * inverse, o[4 * j + 2 * r + 1] * inverse);
    if (c == 0 && t == 0)
      p.lse[row * p.heads + head0 + head] =
          total > 0.f ? (running_max[r] + log2f(total)) * kLn2 : -INFINITY;
  }
}

__global__ void __launch_bounds__(kThreads, 1) sparse_mla_prefill_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  if (threadIdx.x < 128)
    sparse_mla_prefill_warpgroup<0>(p, shared);
  else
    sparse_mla_prefill_warpgroup<1>(p, shared);
}

}  // namespace

namespace detail {

void launch_sparse_mla_prefill(const SparseMlaParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
        sparse_mla_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(params.rows), static_cast<unsigned>(params.heads / kHeads));
  launch_kernel(sparse_mla_prefill_kernel, grid, kThreads, kSharedBytes, stream, params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
