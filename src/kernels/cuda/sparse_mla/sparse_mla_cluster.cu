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
// The kernel is a latency chain (ncu: one 8-warp CTA per SM, ~15 cycles per
// issued instruction, barrier stalls first), so a CTA takes its slots in one
// pass, with as few barriers as the data flow allows:
//   1. slot ids and Q; then every entry loaded straight into registers and
//      dequantised into K[128][576] f16 (no staging buffer, no per-chunk wait);
//   2. S[16 heads][128] = Q K^T    warp w: keys 32*(w%4).., dims 288*(w/4)..
//      (the two dim halves summed in a fixed order);
//   3. softmax (log2 domain), 16 threads per head row, one pass;
//   4. O[16][512] = P V            warp w: dims 64*w..
// Then O / sum and the split's lse go to this CTA's shared memory; after a
// cluster barrier, CTA r merges output dims [r * 512 / C, (r + 1) * 512 / C)
// of all 16 heads over the C splits in rank order (deterministic for a given
// C), writes them as bf16, and rank 0 writes the lse.
#include <cooperative_groups.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
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

struct ClusterShared {
  __half q[kHeads * kStride];
  // K[128][kStride] f16; after PV, this CTA's normalised output [16][512]
  // fp32 (32 KB of its 150 KB) that the cluster reads.
  alignas(16) uint8_t k_bytes[kKeys * kStride * 2];
  float s[2][kHeads * kScoreStride];              // S of the two dim halves
  alignas(16) __half prob[kHeads * kProbStride];  // ldmatrix rows: 16-byte aligned
  int32_t slot_ids[kKeys];
  float row_sum[kHeads];
  float state_lse[kHeads];  // log2 domain (includes the softmax scale)
};
static_assert(kHeads * kLatentRank * 4 <= kKeys * kStride * 2, "the state fits in K's space");

template <int kSplits>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_cluster_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  ClusterShared& sh = *reinterpret_cast<ClusterShared*>(shared_bytes);
  __half* const k_tile = reinterpret_cast<__half*>(sh.k_bytes);
  float* const state = reinterpret_cast<float*>(sh.k_bytes);
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

  // 1. Slot ids (read first: their latency overlaps the Q load), Q.
  if (tid < kKeys) sh.slot_ids[tid] = tid < keys ? p.slots[row * p.top_k + key_begin + tid] : -1;
  {
    const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
    constexpr int kPieces = kHeads * (kDim / 8);                     // 1152 of 16 bytes
    constexpr int kPerThread = (kPieces + kThreads - 1) / kThreads;  // 5
    uint4 raw[kPerThread];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int i = tid + r * kThreads;
      if (i < kPieces)
        raw[r] = *reinterpret_cast<const uint4*>(q_source + (i / (kDim / 8)) * kDim +
                                                 (i % (kDim / 8)) * 8);
    }
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int i = tid + r * kThreads;
      if (i >= kPieces) continue;
      store_bf16x8_as_half(raw[r], kQueryPrescale,
                           &sh.q[(i / (kDim / 8)) * kStride + (i % (kDim / 8)) * 8]);
    }
  }
  __syncthreads();  // slot ids visible

  // Entries: thread -> (key tid / 2, half tid % 2): 256 latent values (two
  // scale groups) and 32 rope values, loaded in two rounds of 8 + 2 16-byte
  // loads (all of a round in flight at once) and dequantised into K.
  {
    const int key = tid / 2, half = tid % 2;
    const int32_t slot = sh.slot_ids[key];
    __half* destination = &k_tile[key * kStride];
    if (slot >= 0) {
      const uint8_t* entry = latent_entry(p, slot);
      const float2 scales = *reinterpret_cast<const float2*>(entry + kLatentScaleOffset + half * 8);
#pragma unroll
      for (int group = 0; group < 2; ++group) {
        const int offset = half * 256 + group * 128;
        uint4 bytes[8];
#pragma unroll
        for (int piece = 0; piece < 8; ++piece)
          bytes[piece] = *reinterpret_cast<const uint4*>(entry + offset + piece * 16);
        uint4 rope[2];  // this group's 16 of the thread's 32 rope values (bf16)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          rope[r] = *reinterpret_cast<const uint4*>(entry + kLatentRopeOffset + half * 64 +
                                                    group * 32 + r * 16);
        const __half2 scale = __float2half2_rn(group == 0 ? scales.x : scales.y);
#pragma unroll
        for (int piece = 0; piece < 8; ++piece) {
          store_e4m3x16_as_half(bytes[piece], scale, destination + offset + piece * 16);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r)
          store_bf16x8_as_half(rope[r], 1.f,
                               destination + kLatentRank + half * 32 + group * 16 + r * 8);
      }
    } else {
      const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int piece = 0; piece < 32; ++piece)
        *reinterpret_cast<uint4*>(destination + half * 256 + piece * 8) = zero;
#pragma unroll
      for (int piece = 0; piece < 4; ++piece)
        *reinterpret_cast<uint4*>(destination + kLatentRank + half * 32 + piece * 8) = zero;
    }
  }
  __syncthreads();  // K complete

  // 2. S = Q K^T: 16 heads x 32 keys x 288 dims per warp (18 k-steps, four
  //    independent accumulator chains).
  {
    const int key_tile = warp % 4, dim_half = warp / 4;
    float s_acc[4][4] = {};
    const __half* a_row = &sh.q[(lane % 16) * kStride + (lane / 16) * 8 + dim_half * kHalfDim];
    const __half* b_row = &k_tile[(key_tile * 32 + lane % 8 + (lane / 16) * 8) * kStride +
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

  // 3. Softmax: 16 threads per head row (a half-warp), 8 keys each.
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

  // 4. O = P V: 16 heads x 64 dims per warp, k = 128 keys (8 k-steps).
  float acc[8][4] = {};  // heads g, g + 8 x dims 64 * warp + 8 n + 2 t ..
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, &sh.prob[(lane % 16) * kProbStride + ks * 16 + (lane / 16) * 8]);
    const __half* v_row = &k_tile[(ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride +
                                  warp * 64 + (lane / 16) * 8];
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_row + np * 16);
      mma_f16_16x8x16(acc[2 * np], a, b[0], b[1]);
      mma_f16_16x8x16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
  __syncthreads();  // every warp is done with K: its space now holds the state

  // This split's normalised output into shared memory (its lse is there already).
  {
    const float sum_low = sh.row_sum[g], sum_high = sh.row_sum[g + 8];
    const float inverse_low = sum_low > 0.f ? 1.f / sum_low : 0.f;
    const float inverse_high = sum_high > 0.f ? 1.f / sum_high : 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int dim = warp * 64 + n * 8 + 2 * t;
      *reinterpret_cast<float2*>(&state[g * kLatentRank + dim]) =
          make_float2(acc[n][0] * inverse_low, acc[n][1] * inverse_low);
      *reinterpret_cast<float2*>(&state[(g + 8) * kLatentRank + dim]) =
          make_float2(acc[n][2] * inverse_high, acc[n][3] * inverse_high);
    }
  }
  cluster.sync();  // every split's state is visible to the cluster

  // Merge: 16 threads per head, each kDims consecutive output dims of this
  // rank's slice, summed over the splits in rank order.
  {
    constexpr int kDims = kLatentRank / kSplits / 16;  // 4 (8 splits) or 2 (16)
    const int head = tid / 16;
    const int dim = split * (kLatentRank / kSplits) + (tid % 16) * kDims;
    float lse[kSplits];
    float max_lse = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      lse[s] = cluster.map_shared_rank(sh.state_lse, s)[head];
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
        const float* remote = cluster.map_shared_rank(state, s) + head * kLatentRank + dim;
        float part[kDims];
        if constexpr (kDims == 4) {
          const float4 v = *reinterpret_cast<const float4*>(remote);
          part[0] = v.x, part[1] = v.y, part[2] = v.z, part[3] = v.w;
        } else {
          const float2 v = *reinterpret_cast<const float2*>(remote);
          part[0] = v.x, part[1] = v.y;
        }
#pragma unroll
        for (int i = 0; i < kDims; ++i) out[i] += weight * part[i];
      }
    }
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    uint16_t* destination = p.out + (row * p.heads + head0 + head) * kLatentRank + dim;
#pragma unroll
    for (int i = 0; i < kDims; i += 2)
      *reinterpret_cast<uint32_t*>(destination + i) =
          pack_bf16x2(out[i] * inverse, out[i + 1] * inverse);
    if (split == 0 && tid % 16 == 0)
      p.lse[row * p.heads + head0 + head] =
          total > 0.f ? (max_lse + log2f(total)) * kLn2 : -INFINITY;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <int kSplits>
void configure(int shared_bytes) {
  MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(sparse_mla_cluster_kernel<kSplits>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          shared_bytes));
  if constexpr (kSplits > 8)
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(sparse_mla_cluster_kernel<kSplits>,
                                            cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

template <int kSplits>
cudaLaunchConfig_t cluster_config(const SparseMlaParams& params,
                                  cudaLaunchAttribute (&attributes)[2], cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  const int heads = params.active_heads > 0 ? params.active_heads : params.heads;
  config.gridDim = dim3(static_cast<unsigned>(static_cast<int64_t>(params.rows) * kSplits),
                        static_cast<unsigned>(heads / kHeads));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(ClusterShared);
  config.stream = stream;
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kSplits;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = programmatic_launch() ? 2 : 1;
  return config;
}

template <int kSplits>
void launch(const SparseMlaParams& params, cudaStream_t stream) {
  static const bool configured = [] {
    configure<kSplits>(static_cast<int>(sizeof(ClusterShared)));
    return true;
  }();
  (void)configured;
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config = cluster_config<kSplits>(params, attributes, stream);
  MEGACTX_CUDA_CHECK(cudaLaunchKernelEx(&config, sparse_mla_cluster_kernel<kSplits>, params));
}

}  // namespace

namespace detail {

int sparse_mla_cluster_max_splits() {
  // Whether a cluster of 16 CTAs (each a whole SM's worth of shared memory)
  // can be resident on this GPU: it needs 16 SMs of one GPC free.
  static const int most = [] {
    configure<16>(static_cast<int>(sizeof(ClusterShared)));
    SparseMlaParams probe;
    probe.rows = 1;
    probe.heads = kHeads;
    cudaLaunchAttribute attributes[2];
    const cudaLaunchConfig_t config = cluster_config<16>(probe, attributes, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, sparse_mla_cluster_kernel<16>, &config) !=
        cudaSuccess) {
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
