// Sparse MLA for many query rows (prefill, long verification batches) on
// Hopper warpgroup MMAs (wgmma, sm_90a). One CTA = one query row x 64 heads
// over all of its top-k slots (no split: prefill has rows enough to fill the
// GPU), three warpgroups:
//
//   producer (warpgroup 2): gathers the row's selected 656-byte fp8 entries
//     from the paged pool, dequantises them to f16 (e4m3 -> f16 exact, the
//     group scale one f16 multiply, rope bf16 -> f16) into K blocks of 32 keys
//     x 576 in the 128-byte swizzle layout, two blocks per stage, two stages
//     in a ring (full / empty mbarriers);
//   consumers (warpgroups 0 and 1), stage after stage, warpgroup c on block c
//     of the stage:
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

// Shared memory, offsets from a 1024-byte aligned base (the swizzle atoms).
constexpr int kQOffset = 0;                                  // [9][64 heads][128 B]
constexpr int kKOffset = kQOffset + kChunks * kQChunkBytes;  // [4][9][32 keys][128 B]
constexpr int kKBytes = kChunks * kKChunkBytes;              // 36864 per block
constexpr int kPOffset = kKOffset + kBuffers * kKBytes;      // [64 heads][128 B]: P of both blocks
constexpr int kMiscOffset = kPOffset + kHeads * 128;

struct Misc {
  float row_max[2][kHeads];        // [warpgroup][head]: the block maxima, exchanged every stage
  float row_sum[2][kHeads];        // [warpgroup][head]: the final sums
  uint8_t valid[kBuffers][kKeys];  // the key's slot is a real entry (not -1, not past top_k)
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

// One thread's quarter of a latent entry in registers: 128 e4m3 (dims
// 128q .. 128q + 128), their group scale and 16 rope bf16 (dims 512 + 16q ..).
struct EntryQuarter {
  uint4 latent[8];
  uint4 rope[2];
  float scale;
  bool valid;
};

__device__ __forceinline__ void load_quarter(EntryQuarter& quarter_data, const SparseMlaParams& p,
                                             int32_t slot, int quarter) {
  quarter_data.valid = slot >= 0;
  if (slot < 0) return;
  const uint8_t* entry = latent_entry(p, slot);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    quarter_data.latent[i] = *reinterpret_cast<const uint4*>(entry + quarter * 128 + i * 16);
#pragma unroll
  for (int i = 0; i < 2; ++i)
    quarter_data.rope[i] =
        *reinterpret_cast<const uint4*>(entry + kLatentRopeOffset + quarter * 32 + i * 16);
  quarter_data.scale = *reinterpret_cast<const float*>(entry + kLatentScaleOffset + quarter * 4);
}

// The quarter as f16 into row `key` of a K block (9 swizzled chunks); zeros for
// a missing slot (P is 0 there, and 0 x NaN of a stale value would poison O).
__device__ __forceinline__ void store_quarter(const EntryQuarter& quarter_data, uint8_t* tile,
                                              int key, int quarter) {
  uint8_t* rope_chunk = tile + 8 * kKChunkBytes;
  if (!quarter_data.valid) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint8_t* chunk = tile + (2 * quarter + i / 4) * kKChunkBytes;
      *reinterpret_cast<uint4*>(chunk + swizzled(key, 2 * (i % 4))) = zero;
      *reinterpret_cast<uint4*>(chunk + swizzled(key, 2 * (i % 4) + 1)) = zero;
    }
    *reinterpret_cast<uint4*>(rope_chunk + swizzled(key, 2 * quarter)) = zero;
    *reinterpret_cast<uint4*>(rope_chunk + swizzled(key, 2 * quarter + 1)) = zero;
    return;
  }
  const __half2 scale = __float2half2_rn(quarter_data.scale);
  // Latent dims 128q + 16i .. +16: chunk 2q + i/4, units 2(i%4) and 2(i%4) + 1.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint8_t* chunk = tile + (2 * quarter + i / 4) * kKChunkBytes;
    store_e4m3x16_as_half(quarter_data.latent[i], scale, chunk + swizzled(key, 2 * (i % 4)),
                          chunk + swizzled(key, 2 * (i % 4) + 1));
  }
  // Rope dims 512 + 16q .. +16: chunk 8, units 2q and 2q + 1.
#pragma unroll
  for (int i = 0; i < 2; ++i)
    store_bf16x8_as_half(quarter_data.rope[i], 1.f,
                         reinterpret_cast<__half*>(rope_chunk + swizzled(key, 2 * quarter + i)));
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
  // MMA needs only its own barrier); thread -> key `lane`, quarter = its warp
  // in the warpgroup. A 16-byte store's 8-lane phase then covers 8 keys of one
  // chunk and unit, which the swizzle spreads over all 32 banks (with four
  // quarters of two keys per phase, ncu counted 13-way conflicts: half of the
  // store wavefronts).
  const int gather_key = lane, quarter = (tid % 128) / 32;
  auto slot_of = [&](int stage) -> int32_t {
    const int index = (2 * stage + c) * kKeys + gather_key;
    return stage < stages && index < p.top_k ? row_slots[index] : -1;
  };
  // Slot ids two stages ahead of the entries, entries one stage ahead of their
  // conversion: the global round trips overlap the MMAs of the stage before.
  int32_t slot_next = slot_of(0), slot_after = slot_of(1);
  EntryQuarter pending;
  auto fetch_next = [&](int stage) {
    load_quarter(pending, p, slot_next, quarter);
    slot_next = slot_after;
    slot_after = slot_of(stage + 2);
  };
  auto convert_pending = [&](int stage) {
    const int buffer = 2 * (stage & 1) + c;
    store_quarter(pending, k_tiles + buffer * kKBytes, gather_key, quarter);
    if (quarter == 0) misc.valid[buffer][gather_key] = pending.valid;
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

  // S_c of a stage: 36 k-steps of 16 over Q's and the block's 9 swizzled chunks.
  auto issue_scores = [&](int stage) {
    // Descriptors as a base plus the k-step's offset (>> 4, within the 14-bit
    // address field); the opaque copy keeps the compiler from hoisting all 72
    // of them out of the stage loop into registers.
    uint32_t q_base = q_address;
    asm volatile("" : "+r"(q_base));
    const uint64_t q_descriptor = swizzle128_descriptor(q_base);
    const uint64_t k_descriptor =
        swizzle128_descriptor(k_address + (2 * (stage & 1) + c) * kKBytes);
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      const uint32_t column = ks / 4, step = (ks % 4) * 32;
      wgmma_m64n32k16_f16_ss(s, q_descriptor + ((column * kQChunkBytes + step) >> 4),
                             k_descriptor + ((column * kKChunkBytes + step) >> 4), ks > 0);
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
    const uint8_t* valid = misc.valid[2 * ring + c];
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = score[4 * j + 2 * r + e];
          value = valid[8 * j + 2 * t + e] ? s[4 * j + 2 * r + e] * scale_log2 : -INFINITY;
          block_max[r] = fmaxf(block_max[r], value);
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      if (t == 0) misc.row_max[c][head_low + 8 * r] = block_max[r];
    }
    named_barrier(kExchangeBarrier, kThreads);
    float factor[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float other = misc.row_max[c ^ 1][head_low + 8 * r];
      const float new_max = fmaxf(running_max[r], fmaxf(block_max[r], other));
      const bool empty = new_max == -INFINITY;  // nothing valid yet: avoid inf - inf
      factor[r] = empty ? 1.f : exp2f(running_max[r] - new_max);
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
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint32_t v =
          k_address + (2 * ring + ks / 2) * kKBytes + (ks % 2) * 16 * 128 + 4 * c * kKChunkBytes;
      wgmma_m64n256k16_f16_ss_tb(o, swizzle128_descriptor(p_address + ks * 32),
                                 swizzle128_mn_descriptor(v, kKChunkBytes), 1);
    }
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
