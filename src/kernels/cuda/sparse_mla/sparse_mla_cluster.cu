// Sparse MLA for decode steps with few rows: the splits of a (row, 16 heads)
// form one thread-block cluster and merge in distributed shared memory.
//
// Why: at batch 1 the general kernel (sparse_mla_attention.cu) runs 64 heads
// per CTA, so a row has only `splits` CTAs, each loading a 74 KB Q tile, and
// its split merge is a second launch over a 4 MB fp32 partial state: ~22 us
// per layer for ~1.3 MB of cache entries (0.3 us at the read floor).
// Here a CTA serves 16 heads of one row (Q 18 KB) and at most 128 of its slots
// (1/C of them), and the C CTAs of a cluster exchange their [16, 512] fp32
// states through DSMEM: no partial buffers in global memory, no merge launch.
//
// The kernel is a latency chain (one 8-warp CTA per SM), so a CTA takes its
// slots in one pass, with as few barriers as the data flow allows:
//   1. slot ids (each warp loads its own 16 keys' ids), Q's loads with them;
//   2. every entry loaded straight into registers, a warp per entry at a time
//      (lane l: bytes 8l.. and 256 + 8l.. of the 512 e4m3, 4 bytes of rope,
//      its two scales), so that each load instruction reads whole cache lines
//      (a thread per entry half touched 32 lines per instruction and spent
//      ~4.5 us there), all 16 of a warp's entries in flight at once; Q is
//      converted while they fly, then they are dequantised into K[128][576] f16;
//   3. S[16 heads][128] = Q K^T    warp w: keys 32*(w%4).., dims 288*(w/4)..
//      (the two dim halves summed in a fixed order);
//   4. softmax (log2 domain), 16 threads per head row, one pass;
//   (3 and 4 with MEGACTX_SPARSE_MLA_REGISTER_SCORES=1, not yet measured:
//   register_scores_softmax, each warp's scores over all 576 dims kept in
//   registers and only per-warp maxima and sums through shared memory);
//   5. O[16][512] = P V            warp w: dims 64*w..
// Then every CTA pushes O / sum as f16, slice by slice with its lse, into the
// CTA that merges the slice (one bulk copy per merger into its shared memory,
// completing on its mbarrier): CTA r merges output dims [r * 512 / C,
// (r + 1) * 512 / C) of all 16 heads over the C splits in rank order
// (deterministic for a given C) and writes them as bf16; rank 0 writes the
// lse. Pushing instead of pulling needs no cluster barrier between the states
// and the merge (a pull merge spent ~4.7 us in its two cluster barriers and
// remote loads; per-thread st.async pushes ~1 us more than the bulk copies):
// a CTA waits only for the bytes it merges, and the one cluster barrier left,
// arrived at once its bytes are in and waited on at exit, keeps each sender
// alive until its copies have read their source.
//
// Early inputs (SparseMlaParams::inputs_ready_at_launch, the kEarly kernels):
// the slot ids and the entries are loaded, and dequantised into K, before the
// programmatic-dependent-launch wait, so the slot id -> entry chain (~3.3 us
// of a ~10 us layer at 8K) and K's conversion overlap the kernel before
// (W_UK's product, or the query pack); only Q waits (10.1 -> 8.5 us per layer
// on the H100 for the loads, 8.5 -> 8.2-8.3 for K's conversion;
// docs/benchmarks.md). Safe
// because every kernel of the stream waits for its predecessor before it
// triggers its successor (launch.cuh): when this kernel starts, all kernels
// two or more launches back have completed, and those wrote the slots (the
// top-k, or for IndexShare layers an earlier layer's) and the entries (the
// latent write). The early loads go to L2 only (ld.global.cg): this SM's L1
// may still hold lines from before those writes.
//
// Q's rope columns may come unrotated (SparseMlaParams::q_rope_bf16): the
// kernel turns them as the query pack would, and the decode path launches no
// pack, so the kernel right before this one is W_UK's product, which writes
// Q's latent columns (one launch fewer per layer, and the early loads overlap
// that product instead of the pack).
#include <cooperative_groups.h>

#include <cstdlib>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/row_ops.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/sparse_mla/latent_convert.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kHeads = kSparseMlaClusterHeads;  // 16
constexpr int kKeys = kSparseMlaClusterKeys;    // 128 slots at most per CTA
constexpr int kDim = kSparseMlaQueryDim;        // 576
constexpr int kHalfDim = kDim / 2;              // 288
constexpr int kStride = kDim + 8;               // f16 per Q/K row in smem (ldmatrix banks)
constexpr int kScoreStride = kKeys + 1;         // fp32 per S row
constexpr int kProbStride = kKeys + 8;          // f16 per P row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kQueryPrescale = 1.f / 64.f;  // as the general kernel: |q| up to 4e6 fits f16

// What each CTA of the cluster receives for its merge: from every split, a
// block of the split's normalised output over this CTA's slice of the 512
// dims ([16 heads][512 / C] f16) followed by its 16 lse values (fp32, log2
// domain): 17 KB at most.
constexpr int kIncomingBytes = kHeads * kLatentRank * 2 + kSparseMlaClusterMaxSplits * kHeads * 4;

struct ClusterShared {
  __half q[kHeads * kStride];
  alignas(16) __half k[kKeys * kStride];
  float s[2][kHeads * kScoreStride];              // S of the two dim halves
  alignas(16) __half prob[kHeads * kProbStride];  // ldmatrix rows: 16-byte aligned
  alignas(16) uint8_t incoming[kIncomingBytes];
  int32_t slot_ids[kKeys];
  float row_sum[kHeads];
  float state_lse[kHeads];  // log2 domain (includes the softmax scale)
  // Scores kept in registers (kRegisterScores): each warp's maximum and sum
  // of its keys' scores per head.
  float part_max[kThreads / 32][kHeads];
  float part_sum[kThreads / 32][kHeads];
  uint64_t incoming_barrier;  // completes when every other split's block has landed
};
static_assert(sizeof(ClusterShared) <= 227 * 1024, "sparse MLA cluster: shared memory");

// The address of `local` (this CTA's shared memory) in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_address(const void* local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(shared_address(local)), "r"(rank));
  return remote;
}
// A load of the slot ids or the entries: through L2 only when it may run
// before the grid-dependency wait (see the file comment).
template <bool kEarly, typename T>
__device__ __forceinline__ T load_input(const T* address) {
  if constexpr (kEarly) {
    return __ldcg(address);
  } else {
    return *address;
  }
}

// Q's rope columns [column, column + 8) of (row, head) from the unrotated
// bf16 source, turned by the row's (cos, sin) as interleaved pairs (2i, 2i + 1)
// and rounded to bf16 as the query pack does (pack_mla_queries): the same bits.
__device__ __forceinline__ uint4 rotated_rope_piece(const SparseMlaParams& p, int64_t row, int head,
                                                    int column) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p.q_rope_bf16 + row * p.rope_row_stride +
                                                    head * p.rope_head_stride + column);
  const int64_t pair = row * (kLatentRope / 2) + column / 2;
  const float4 c = *reinterpret_cast<const float4*>(p.rope_cos + pair);
  const float4 s = *reinterpret_cast<const float4*>(p.rope_sin + pair);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  const float cs[4] = {c.x, c.y, c.z, c.w}, sn[4] = {s.x, s.y, s.z, s.w};
  uint32_t out[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float x1 = __uint_as_float(words[w] << 16), x2 = __uint_as_float(words[w] & 0xffff0000u);
    out[w] = uint32_t{float_to_bf16_bits(rope_first(x1, x2, cs[w], sn[w]))} |
             (uint32_t{float_to_bf16_bits(rope_second(x1, x2, cs[w], sn[w]))} << 16);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Stages 3 and 4 as first built: S's two dim halves summed and normalised
// through shared memory.
__device__ __forceinline__ void shared_scores_softmax(ClusterShared& sh, int warp, int lane,
                                                      float scale_log2) {
  const int tid = warp * 32 + lane, g = lane / 4, t = lane % 4;
  // 3. S = Q K^T: 16 heads x 32 keys x 288 dims per warp (18 k-steps, four
  //    independent accumulator chains).
  {
    const int key_tile = warp % 4, dim_half = warp / 4;
    float s_acc[4][4] = {};
    const __half* a_row = &sh.q[(lane % 16) * kStride + (lane / 16) * 8 + dim_half * kHalfDim];
    const __half* b_row = &sh.k[(key_tile * 32 + lane % 8 + (lane / 16) * 8) * kStride +
                                ((lane / 8) % 2) * 8 + dim_half * kHalfDim];
#pragma unroll 6
    for (int ks = 0; ks < kHalfDim / 16; ++ks) {
      uint32_t a[4], b[4], c[4];
      ldmatrix_x4(a, a_row + ks * 16);
      ldmatrix_x4(b, b_row + ks * 16);
      ldmatrix_x4(c, b_row + 16 * kStride + ks * 16);
      mma_f16_16x8x16(s_acc[0], a, b[0], b[1]);
      mma_f16_16x8x16(s_acc[1], a, b[2], b[3]);
      mma_f16_16x8x16(s_acc[2], a, c[0], c[1]);
      mma_f16_16x8x16(s_acc[3], a, c[2], c[3]);
    }
    float* s = sh.s[dim_half];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int key = key_tile * 32 + nt * 8 + 2 * t;
      s[g * kScoreStride + key] = s_acc[nt][0];
      s[g * kScoreStride + key + 1] = s_acc[nt][1];
      s[(g + 8) * kScoreStride + key] = s_acc[nt][2];
      s[(g + 8) * kScoreStride + key + 1] = s_acc[nt][3];
    }
  }
  __syncthreads();

  // 4. Softmax: 16 threads per head row (a half-warp), 8 keys each.
  float row_max = -INFINITY;  // of this thread's head (valid in every lane of its half-warp)
  {
    const int head = tid / 16, part = tid % 16;
    float values[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int key = part * 8 + i;
      const float sum = sh.s[0][head * kScoreStride + key] + sh.s[1][head * kScoreStride + key];
      values[i] = sh.slot_ids[key] >= 0 ? sum * scale_log2 : -INFINITY;
      row_max = fmaxf(row_max, values[i]);
    }
#pragma unroll
    for (int offset = 1; offset < 16; offset *= 2)
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, offset));
    const bool empty = row_max == -INFINITY;  // no valid slot: avoid inf - inf
    float sum = 0.f;
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const float p0 = empty ? 0.f : exp2f(values[i] - row_max);
      const float p1 = empty ? 0.f : exp2f(values[i + 1] - row_max);
      sum += p0 + p1;
      packed[i / 2] = pack_half2(p0, p1);
    }
    *reinterpret_cast<uint4*>(&sh.prob[head * kProbStride + part * 8]) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
#pragma unroll
    for (int offset = 1; offset < 16; offset *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (part == 0) {
      sh.row_sum[head] = sum;
      sh.state_lse[head] = sum > 0.f ? row_max + log2f(sum) : -INFINITY;
    }
  }
  __syncthreads();
}

// Stages 3 and 4 with the scores in registers: warp w computes S for all 16
// heads x its keys 16w .. 16w + 15 over all 576 dims (36 k-steps, the even
// and odd ones in separate accumulators: four chains of 18, as the two-half
// layout has), so no partial S goes through shared memory. The softmax then
// needs only each warp's per-head maximum and sum there: one barrier after
// the maxima, one after P (f16, [16 heads][128 keys], as the PV stage reads
// it) and the sums. Thread (g, t) holds heads g / g + 8 x keys 16w + 8n + 2t
// + e. The sums over the 8 warps go in warp order (deterministic).
__device__ __forceinline__ void register_scores_softmax(ClusterShared& sh, int warp, int lane,
                                                        float scale_log2) {
  const int g = lane / 4, t = lane % 4;
  float acc[2][2][4] = {};  // [k-step parity][key tile n][fragment]
  const __half* a_row = &sh.q[(lane % 16) * kStride + (lane / 16) * 8];
  const __half* b_row =
      &sh.k[(warp * 16 + lane % 8 + (lane / 16) * 8) * kStride + ((lane / 8) % 2) * 8];
#pragma unroll 6
  for (int ks = 0; ks < kDim / 16; ++ks) {
    uint32_t a[4], b[4];
    ldmatrix_x4(a, a_row + ks * 16);
    ldmatrix_x4(b, b_row + ks * 16);
    mma_f16_16x8x16(acc[ks % 2][0], a, b[0], b[1]);
    mma_f16_16x8x16(acc[ks % 2][1], a, b[2], b[3]);
  }
  // values[n][r][e]: head g + 8r, key 16w + 8n + 2t + e, log2 units; -inf
  // for a missing slot.
  float values[2][2][2];
  float max_of[2] = {-INFINITY, -INFINITY};  // [r]
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool valid = sh.slot_ids[warp * 16 + 8 * n + 2 * t + e] >= 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float sum = acc[0][n][2 * r + e] + acc[1][n][2 * r + e];
        values[n][r][e] = valid ? sum * scale_log2 : -INFINITY;
        max_of[r] = fmaxf(max_of[r], values[n][r][e]);
      }
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    max_of[r] = fmaxf(max_of[r], __shfl_xor_sync(0xffffffffu, max_of[r], 1));
    max_of[r] = fmaxf(max_of[r], __shfl_xor_sync(0xffffffffu, max_of[r], 2));
  }
  if (t == 0) {
    sh.part_max[warp][g] = max_of[0];
    sh.part_max[warp][g + 8] = max_of[1];
  }
  __syncthreads();
  float row_max[2], sum_of[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_max[r] = -INFINITY;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w)
      row_max[r] = fmaxf(row_max[r], sh.part_max[w][g + 8 * r]);
    sum_of[r] = 0.f;
  }
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool empty = row_max[r] == -INFINITY;  // no valid slot: avoid inf - inf
      const float p0 = empty ? 0.f : exp2f(values[n][r][0] - row_max[r]);
      const float p1 = empty ? 0.f : exp2f(values[n][r][1] - row_max[r]);
      sum_of[r] += p0 + p1;
      *reinterpret_cast<uint32_t*>(
          &sh.prob[(g + 8 * r) * kProbStride + warp * 16 + 8 * n + 2 * t]) = pack_half2(p0, p1);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum_of[r] += __shfl_xor_sync(0xffffffffu, sum_of[r], 1);
    sum_of[r] += __shfl_xor_sync(0xffffffffu, sum_of[r], 2);
  }
  if (t == 0) {
    sh.part_sum[warp][g] = sum_of[0];
    sh.part_sum[warp][g + 8] = sum_of[1];
  }
  __syncthreads();
  if (const int tid = warp * 32 + lane; tid < kHeads) {
    float max = -INFINITY, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      max = fmaxf(max, sh.part_max[w][tid]);
      sum += sh.part_sum[w][tid];
    }
    sh.row_sum[tid] = sum;
    sh.state_lse[tid] = sum > 0.f ? max + log2f(sum) : -INFINITY;
  }
  // row_sum and state_lse are read after the barrier that ends PV.
}

// kRegisterScores (MEGACTX_SPARSE_MLA_REGISTER_SCORES=1, off until measured):
// stages 3 and 4 with each warp's scores kept in registers (below) instead of
// two dim halves summed and normalised through shared memory.
template <int kSplits, bool kEarly, bool kRegisterScores>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_cluster_kernel(SparseMlaParams p) {
  static_assert(kSplits <= kSparseMlaClusterMaxSplits && kKeys == 16 * (kThreads / 32));
  constexpr int kSlice = kLatentRank / kSplits;         // output dims each CTA merges: 32 or 64
  constexpr int kLseOffset = kHeads * kSlice * 2;       // bytes: f16 outputs, then fp32 lse
  constexpr int kBlockBytes = kLseOffset + kHeads * 4;  // one split's block for one merger
  constexpr unsigned kExpectedBytes = (kSplits - 1) * kBlockBytes;  // the other splits' copies
  static_assert(kSplits * kBlockBytes <= kIncomingBytes && kBlockBytes % 16 == 0);
  static_assert(kSplits * kBlockBytes <= kKeys * kStride * 2);  // the staging fits in K
  if constexpr (!kEarly) {
    grid_dependency_wait();
    grid_dependency_trigger();
  }
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  ClusterShared& sh = *reinterpret_cast<ClusterShared*>(shared_bytes);
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row = blockIdx.x / kSplits;
  const int split = static_cast<int>(cluster.block_rank());
  const int head0 = blockIdx.y * kHeads;
  // Slots in chunks of 64, the chunks spread evenly (at most two per split).
  const int total_chunks = (p.top_k + 63) / 64;
  const int chunks_per_split = (total_chunks + kSplits - 1) / kSplits;
  const int key_begin = split * chunks_per_split * 64;
  const int key_end = min(p.top_k, key_begin + chunks_per_split * 64);
  const int keys = max(0, key_end - key_begin);  // <= kKeys (checked by the launcher)
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;

  // The merge's barrier expects every split's bytes from the start; the
  // cluster arrive (waited on just before the first remote store) tells the
  // other CTAs that this one runs and its barrier is initialised.
  if (tid == 0) {
    mbarrier_init(&sh.incoming_barrier, 1);
    mbarrier_init_fence();
    mbarrier_arrive_expect_bytes(&sh.incoming_barrier, kExpectedBytes);
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");

  // 1. Slot ids: warp w takes keys w + 8 i (i < 16); lane i loads key i's id.
  int32_t my_slot = -1;
  if (lane < 16) {
    const int key = warp + 8 * lane;
    if (key < keys) my_slot = load_input<kEarly>(&p.slots[row * p.top_k + key_begin + key]);
  }
  // Q's loads go out with the slot ids' (after the entries' with early
  // inputs: Q is the predecessor's output); it is converted while the entries
  // are in flight.
  const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
  constexpr int kQueryPieces = kHeads * (kDim / 8);                          // 1152 of 16 bytes
  constexpr int kQueryPerThread = (kQueryPieces + kThreads - 1) / kThreads;  // 5
  uint4 query[kQueryPerThread];
  auto load_query = [&] {
#pragma unroll
    for (int r = 0; r < kQueryPerThread; ++r) {
      const int i = tid + r * kThreads;
      if (i >= kQueryPieces) continue;
      const int head = i / (kDim / 8), column = (i % (kDim / 8)) * 8;
      if (p.q_rope_bf16 != nullptr && column >= kLatentRank) {
        query[r] = rotated_rope_piece(p, row, head0 + head, column - kLatentRank);
      } else {
        query[r] = *reinterpret_cast<const uint4*>(q_source + head * kDim + column);
      }
    }
  };
  if constexpr (!kEarly) load_query();

  // 2. Entries, a warp's 16 at once: lane l loads e4m3 bytes [8l, 8l + 8) and
  //    [256 + 8l, 256 + 8l + 8), the scales of their groups (l / 16 and
  //    2 + l / 16) and rope values 2l, 2l + 1; a missing slot gives zeros.
  uint2 low[16], high[16];
  float scale_low[16], scale_high[16];
  uint32_t rope[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int32_t slot = __shfl_sync(0xffffffffu, my_slot, i);
    if (slot >= 0) {
      const uint8_t* entry = latent_entry(p, slot);
      low[i] = load_input<kEarly>(reinterpret_cast<const uint2*>(entry + 8 * lane));
      high[i] = load_input<kEarly>(reinterpret_cast<const uint2*>(entry + 256 + 8 * lane));
      const float* scales = reinterpret_cast<const float*>(entry + kLatentScaleOffset);
      scale_low[i] = load_input<kEarly>(&scales[lane / 16]);
      scale_high[i] = load_input<kEarly>(&scales[2 + lane / 16]);
      rope[i] = load_input<kEarly>(
          reinterpret_cast<const uint32_t*>(entry + kLatentRopeOffset + 4 * lane));
    } else {
      low[i] = high[i] = make_uint2(0, 0);
      scale_low[i] = scale_high[i] = 0.f;
      rope[i] = 0;
    }
  }
  if (lane < 16) sh.slot_ids[warp + 8 * lane] = my_slot;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    __half* destination = &sh.k[(warp + 8 * i) * kStride];
    uint32_t h[4];
    const __half2 scale0 = __float2half2_rn(scale_low[i]);
    e4m3x4_scaled_to_half2(low[i].x, scale0, h[0], h[1]);
    e4m3x4_scaled_to_half2(low[i].y, scale0, h[2], h[3]);
    *reinterpret_cast<uint4*>(destination + 8 * lane) = make_uint4(h[0], h[1], h[2], h[3]);
    const __half2 scale1 = __float2half2_rn(scale_high[i]);
    e4m3x4_scaled_to_half2(high[i].x, scale1, h[0], h[1]);
    e4m3x4_scaled_to_half2(high[i].y, scale1, h[2], h[3]);
    *reinterpret_cast<uint4*>(destination + 256 + 8 * lane) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint32_t*>(destination + kLatentRank + 2 * lane) =
        pack_half2(__uint_as_float(rope[i] << 16), __uint_as_float(rope[i] & 0xffff0000u));
  }
  // With early inputs K is in shared memory before the wait: only Q's loads
  // and conversion follow it.
  if constexpr (kEarly) {
    grid_dependency_wait();
    grid_dependency_trigger();
    load_query();
  }
#pragma unroll
  for (int r = 0; r < kQueryPerThread; ++r) {
    const int i = tid + r * kThreads;
    if (i < kQueryPieces)
      store_bf16x8_as_half(query[r], kQueryPrescale,
                           &sh.q[(i / (kDim / 8)) * kStride + (i % (kDim / 8)) * 8]);
  }
  __syncthreads();  // K, Q and the slot ids complete

  if constexpr (kRegisterScores)
    register_scores_softmax(sh, warp, lane, scale_log2);
  else
    shared_scores_softmax(sh, warp, lane, scale_log2);

  // 5. O = P V: 16 heads x 64 dims per warp, k = 128 keys (8 k-steps).
  float acc[8][4] = {};  // heads g, g + 8 x dims 64 * warp + 8 n + 2 t ..
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, &sh.prob[(lane % 16) * kProbStride + ks * 16 + (lane / 16) * 8]);
    const __half* v_row =
        &sh.k[(ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + warp * 64 + (lane / 16) * 8];
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_row + np * 16);
      mma_f16_16x8x16(acc[2 * np], a, b[0], b[1]);
      mma_f16_16x8x16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }

  // Push: every split stages its normalised output as f16, block by block
  // (the block for merger r: [16 heads][kSlice] over r's dims, then its 16 lse
  // values as fp32), in K's space (free once every warp is past PV), and sends
  // each other CTA its block with one bulk copy into that CTA's shared memory,
  // counted on its mbarrier; its own block it writes in place. f16 loses
  // nothing the bf16 output keeps (O is a convex combination of f16 V rows).
  __syncthreads();  // every warp is done with K and P
  uint8_t* stage = reinterpret_cast<uint8_t*>(sh.k);
  auto block_at = [&](int owner) {
    return owner == split ? &sh.incoming[split * kBlockBytes] : stage + owner * kBlockBytes;
  };
  {
    const float sum_low = sh.row_sum[g], sum_high = sh.row_sum[g + 8];
    const float inverse_low = sum_low > 0.f ? 1.f / sum_low : 0.f;
    const float inverse_high = sum_high > 0.f ? 1.f / sum_high : 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int dim = warp * 64 + n * 8 + 2 * t;
      __half* block = reinterpret_cast<__half*>(block_at(dim / kSlice));
      *reinterpret_cast<uint32_t*>(&block[g * kSlice + dim % kSlice]) =
          pack_half2(acc[n][0] * inverse_low, acc[n][1] * inverse_low);
      *reinterpret_cast<uint32_t*>(&block[(g + 8) * kSlice + dim % kSlice]) =
          pack_half2(acc[n][2] * inverse_high, acc[n][3] * inverse_high);
    }
    if (tid < kSplits * kHeads) {
      const int owner = tid / kHeads, head = tid % kHeads;
      reinterpret_cast<float*>(block_at(owner) + kLseOffset)[head] = sh.state_lse[head];
    }
  }
  fence_proxy_async_shared();  // the staged blocks, written by threads, read by the copy engine
  __syncthreads();
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // every CTA is running
  if (tid < kSplits && tid != split)
    bulk_copy_to_cluster(cluster_address(&sh.incoming[split * kBlockBytes], tid),
                         shared_address(stage + tid * kBlockBytes), kBlockBytes,
                         cluster_address(&sh.incoming_barrier, tid));

  // Merge this CTA's slice: 16 threads per head, each kDims consecutive dims,
  // summed over the splits in rank order.
  mbarrier_wait(&sh.incoming_barrier, 0);
  // Every copy this CTA receives has landed; once all CTAs say so, every
  // copy has read its source, and a CTA may exit (waited on at the end).
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  {
    constexpr int kDims = kSlice / 16;  // 2 (16 splits) or 4 (8)
    const int head = tid / 16;
    const int local = (tid % 16) * kDims;
    float lse[kSplits];
    float max_lse = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      lse[s] = reinterpret_cast<const float*>(&sh.incoming[s * kBlockBytes + kLseOffset])[head];
      max_lse = fmaxf(max_lse, lse[s]);
    }
    float out[kDims] = {};
    float total = 0.f;
    if (max_lse != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kSplits; ++s) {
        const float weight = exp2f(lse[s] - max_lse);
        if (weight == 0.f) continue;
        total += weight;
        const __half* part =
            reinterpret_cast<const __half*>(&sh.incoming[s * kBlockBytes]) + head * kSlice + local;
#pragma unroll
        for (int i = 0; i < kDims; ++i) out[i] += weight * __half2float(part[i]);
      }
    }
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    uint16_t* destination =
        p.out + (row * p.heads + head0 + head) * kLatentRank + split * kSlice + local;
#pragma unroll
    for (int i = 0; i < kDims; i += 2)
      *reinterpret_cast<uint32_t*>(destination + i) =
          pack_bf16x2(out[i] * inverse, out[i + 1] * inverse);
    if (split == 0 && tid % 16 == 0)
      p.lse[row * p.heads + head0 + head] =
          total > 0.f ? (max_lse + log2f(total)) * kLn2 : -INFINITY;
  }
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

template <int kSplits, bool kEarly, bool kRegisterScores = false>
void configure(int shared_bytes) {
  auto kernel = sparse_mla_cluster_kernel<kSplits, kEarly, kRegisterScores>;
  MEGACTX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  if constexpr (kSplits > 8)
    MEGACTX_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

template <int kSplits>
cudaLaunchConfig_t cluster_config(const SparseMlaParams& params,
                                  cudaLaunchAttribute (&attributes)[2], cudaStream_t stream) {
  const int heads = params.active_heads > 0 ? params.active_heads : params.heads;
  return cluster_launch_config(
      dim3(static_cast<unsigned>(static_cast<int64_t>(params.rows) * kSplits),
           static_cast<unsigned>(heads / kHeads)),
      dim3(kThreads), sizeof(ClusterShared), stream, kSplits, attributes);
}

template <int kSplits, bool kEarly, bool kRegisterScores>
void launch_variant(const SparseMlaParams& params, cudaStream_t stream) {
  static const bool configured = [] {
    configure<kSplits, kEarly, kRegisterScores>(static_cast<int>(sizeof(ClusterShared)));
    return true;
  }();
  (void)configured;
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config = cluster_config<kSplits>(params, attributes, stream);
  MEGACTX_CUDA_CHECK(cudaLaunchKernelEx(
      &config, sparse_mla_cluster_kernel<kSplits, kEarly, kRegisterScores>, params));
}

// Temporary A/B switch until measured on a GPU: MEGACTX_SPARSE_MLA_REGISTER_SCORES=1.
bool register_scores() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_REGISTER_SCORES");
    return value != nullptr && value[0] == '1';
  }();
  return on;
}

template <int kSplits, bool kRegisterScores>
void launch_inputs(const SparseMlaParams& params, cudaStream_t stream) {
  if (params.inputs_ready_at_launch) {
    launch_variant<kSplits, true, kRegisterScores>(params, stream);
  } else {
    launch_variant<kSplits, false, kRegisterScores>(params, stream);
  }
}

template <int kSplits>
void launch(const SparseMlaParams& params, cudaStream_t stream) {
  if (register_scores())
    launch_inputs<kSplits, true>(params, stream);
  else
    launch_inputs<kSplits, false>(params, stream);
}

}  // namespace

namespace detail {

int sparse_mla_cluster_max_splits() {
  // Whether a cluster of 16 CTAs (each a whole SM's worth of shared memory)
  // can be resident on this GPU: it needs 16 SMs of one GPC free.
  static const int most = [] {
    configure<16, false>(static_cast<int>(sizeof(ClusterShared)));
    SparseMlaParams probe;
    probe.rows = 1;
    probe.heads = kHeads;
    cudaLaunchAttribute attributes[2];
    const cudaLaunchConfig_t config = cluster_config<16>(probe, attributes, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, sparse_mla_cluster_kernel<16, false, false>,
                                       &config) != cudaSuccess) {
      (void)cudaGetLastError();
      clusters = 0;
    }
    return clusters > 0 ? 16 : 8;
  }();
  return most;
}

void launch_sparse_mla_cluster(const SparseMlaParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  if (params.num_splits == 16) {
    launch<16>(params, stream);
  } else {
    launch<8>(params, stream);
  }
}

}  // namespace detail
}  // namespace megactx::cuda
