// Sparse MLA for decode steps with few rows: the splits of a (row, 16 heads)
// form one thread-block cluster and merge in distributed shared memory.
//
// Why: at batch 1 the general kernel (sparse_mla_attention.cu) runs 64 heads
// per CTA, so a row has only `splits` CTAs, each loading a 74 KB Q tile, and
// its split merge is a second launch over a 4 MB fp32 partial state: ~26 us
// per layer for ~1.3 MB of cache entries (0.4 us at the read floor).
// Here a CTA serves 16 heads of one row (Q 18 KB) and 1/C of its slots, and
// the C CTAs of a cluster exchange their [16, 512] fp32 states through
// DSMEM: no partial buffers in global memory, no merge launch.
//
// Per CTA (8 warps), for each chunk of 64 slots:
//   1. dequantise the chunk's raw entries (one bulk copy each, fetched while
//      the previous chunk computed) into K[64][576] f16; then fetch the next
//      chunk's entries into the freed staging buffer;
//   2. S[16 heads][64] = Q K^T     warp w: keys 16*(w%4).., dims 288*(w/4)..
//      (the two dim halves summed in a fixed order);
//   3. online softmax (log2 domain), 16 threads per head row;
//   4. O[16][512] += P V           warp w: dims 64*w..
// Then O / sum and the split's lse go to this CTA's shared memory; after a
// cluster barrier, CTA r merges output dims [r * 512 / C, (r + 1) * 512 / C)
// of all 16 heads over the C splits in rank order (deterministic for a given
// C), writes them as bf16, and rank 0 writes the lse.
#include <cooperative_groups.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kHeads = kSparseMlaClusterHeads;  // 16
constexpr int kChunk = 64;                      // slots per step
constexpr int kDim = kSparseMlaQueryDim;        // 576
constexpr int kHalfDim = kDim / 2;              // 288
constexpr int kStride = kDim + 8;               // f16 per Q/K row in smem (ldmatrix banks)
constexpr int kScoreStride = kChunk + 1;        // fp32 per S row
constexpr int kProbStride = kChunk + 8;         // f16 per P row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kQueryPrescale = 1.f / 64.f;  // as the general kernel: |q| up to 4e6 fits f16

struct ClusterShared {
  __half q[kHeads * kStride];
  // K[64][kStride] f16 of the current chunk; after the last chunk, this
  // CTA's normalised output [16][512] fp32 (32 KB of its 74 KB) that the
  // cluster reads.
  alignas(16) uint8_t k_bytes[kChunk * kStride * 2];
  alignas(16) uint8_t raw[kChunk * kLatentBytes];  // the next chunk's fp8 entries
  int32_t slot_ids[2][kChunk];
  float s[2][kHeads * kScoreStride];              // S of the two dim halves
  alignas(16) __half prob[kHeads * kProbStride];  // ldmatrix rows: 16-byte aligned
  float row_max[kHeads];
  float row_sum[kHeads];
  float row_factor[kHeads];
  float state_lse[kHeads];  // log2 domain (includes the softmax scale)
  uint64_t raw_full;        // mbarrier: the chunk's entries have landed
};
static_assert(kHeads * kLatentRank * 4 <= kChunk * kStride * 2, "the state fits in K's space");

template <int kSplits>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_cluster_kernel(SparseMlaParams p) {
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
  const int total_chunks = (p.top_k + kChunk - 1) / kChunk;
  const int chunks_per_split = (total_chunks + kSplits - 1) / kSplits;
  const int key_begin = split * chunks_per_split * kChunk;
  const int key_end = min(p.top_k, key_begin + chunks_per_split * kChunk);
  const int chunks = key_end > key_begin ? (key_end - key_begin + kChunk - 1) / kChunk : 0;
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;

  const int32_t* row_slots = p.slots + row * p.top_k;
  auto read_slot_id = [&](int chunk) -> int32_t {
    const int key = key_begin + chunk * kChunk + tid;
    return tid < kChunk && chunk < chunks && key < key_end ? row_slots[key] : -1;
  };
  // One bulk copy (TMA) per entry, issued by the key's thread: 64 requests per
  // chunk where 16-byte cp.async needed 2624 (the SM's issue rate limited
  // those). Every key thread arrives once per phase, with the entry's bytes
  // announced when it has one.
  auto fetch_entries = [&](int buffer) {
    if (tid >= kChunk) return;
    const int32_t slot = sh.slot_ids[buffer][tid];
    // The raw buffer was read by ordinary loads: order them before the copy engine writes.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (slot >= 0) {
      mbarrier_arrive_expect_bytes(&sh.raw_full, kLatentBytes);
      bulk_copy_to_shared(&sh.raw[tid * kLatentBytes],
                          p.kv_pool + static_cast<int64_t>(slot) * kLatentBytes, kLatentBytes,
                          &sh.raw_full);
    } else {
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(&sh.raw_full))
                   : "memory");
    }
  };

  // Slot ids first (their latency then overlaps the Q load).
  int32_t pending_slot = read_slot_id(0);
  // Q [16 heads][576] bf16 -> f16 * 2^-6: 1152 pieces of 16 bytes, 4.5 per thread.
  {
    const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
    constexpr int kPieces = kHeads * (kDim / 8);
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
      const uint32_t words[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
      uint32_t packed[4];
#pragma unroll
      for (int w = 0; w < 4; ++w)
        packed[w] = pack_half2(__uint_as_float(words[w] << 16) * kQueryPrescale,
                               __uint_as_float(words[w] & 0xffff0000u) * kQueryPrescale);
      *reinterpret_cast<uint4*>(&sh.q[(i / (kDim / 8)) * kStride + (i % (kDim / 8)) * 8]) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
  if (tid < kHeads) {
    sh.row_max[tid] = -INFINITY;
    sh.row_sum[tid] = 0.f;
  }
  if (tid == 0) {
    mbarrier_init(&sh.raw_full, kChunk);
    mbarrier_init_fence();
  }
  if (tid < kChunk) sh.slot_ids[0][tid] = pending_slot;
  pending_slot = read_slot_id(1);
  __syncthreads();
  if (chunks > 0) fetch_entries(0);

  const int key_tile = warp % 4;  // S: keys 16 * key_tile ..
  const int dim_half = warp / 4;  // S: dims 288 * dim_half ..
  float acc[8][4];                // O: heads g, g + 8 x dims 64 * warp + 8 n + 2 t ..
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int buffer = chunk % 2;
    mbarrier_wait(&sh.raw_full, static_cast<unsigned>(chunk & 1));  // the chunk's entries
    __syncthreads();  // and every warp is done with the previous chunk's K

    // 1. Dequantise: thread -> (key tid / 4, quarter tid % 4): 128 latent values
    //    (one scale group) and 16 rope values.
    {
      const int key = tid / 4, quarter = tid % 4;
      const int32_t slot = sh.slot_ids[buffer][key];
      __half* destination = &k_tile[key * kStride];
      if (slot >= 0) {
        const uint8_t* entry = &sh.raw[key * kLatentBytes];
        const __half2 scale = __float2half2_rn(
            *reinterpret_cast<const float*>(entry + kLatentScaleOffset + quarter * 4));
#pragma unroll
        for (int piece = 0; piece < 8; ++piece) {
          const uint4 bytes = *reinterpret_cast<const uint4*>(entry + quarter * 128 + piece * 16);
          const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
          uint32_t packed[8];
#pragma unroll
          for (int w = 0; w < 4; ++w)
            e4m3x4_scaled_to_half2(words[w], scale, packed[2 * w], packed[2 * w + 1]);
          uint4* out = reinterpret_cast<uint4*>(destination + quarter * 128 + piece * 16);
          out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
          out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint4 rope =
              *reinterpret_cast<const uint4*>(entry + kLatentRopeOffset + quarter * 32 + half * 16);
          const uint32_t rope_words[4] = {rope.x, rope.y, rope.z, rope.w};
          uint32_t rope_half[4];
#pragma unroll
          for (int w = 0; w < 4; ++w)
            rope_half[w] = pack_half2(__uint_as_float(rope_words[w] << 16),
                                      __uint_as_float(rope_words[w] & 0xffff0000u));
          *reinterpret_cast<uint4*>(destination + kLatentRank + quarter * 16 + half * 8) =
              make_uint4(rope_half[0], rope_half[1], rope_half[2], rope_half[3]);
        }
      } else {
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int piece = 0; piece < 16; ++piece)
          *reinterpret_cast<uint4*>(destination + quarter * 128 + piece * 8) = zero;
        *reinterpret_cast<uint4*>(destination + kLatentRank + quarter * 16) = zero;
        *reinterpret_cast<uint4*>(destination + kLatentRank + quarter * 16 + 8) = zero;
      }
    }
    // The next chunk's ids to smem (the other buffer: nobody reads it this chunk).
    if (tid < kChunk) sh.slot_ids[buffer ^ 1][tid] = pending_slot;
    pending_slot = read_slot_id(chunk + 2);
    __syncthreads();  // K complete, raw free, next ids visible
    if (chunk + 1 < chunks) fetch_entries(buffer ^ 1);

    // 2. S = Q K^T: 16 heads x 16 keys x 288 dims per warp (18 k-steps).
    {
      float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const __half* a_row = &sh.q[(lane % 16) * kStride + (lane / 16) * 8 + dim_half * kHalfDim];
      const __half* b_row = &k_tile[(key_tile * 16 + lane % 8 + (lane / 16) * 8) * kStride +
                                    ((lane / 8) % 2) * 8 + dim_half * kHalfDim];
#pragma unroll 6
      for (int ks = 0; ks < kHalfDim / 16; ++ks) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, a_row + ks * 16);
        ldmatrix_x4(b, b_row + ks * 16);
        mma_f16_16x8x16(s_acc[0], a, b[0], b[1]);
        mma_f16_16x8x16(s_acc[1], a, b[2], b[3]);
      }
      float* s = sh.s[dim_half];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = key_tile * 16 + nt * 8 + 2 * t;
        s[g * kScoreStride + key] = s_acc[nt][0];
        s[g * kScoreStride + key + 1] = s_acc[nt][1];
        s[(g + 8) * kScoreStride + key] = s_acc[nt][2];
        s[(g + 8) * kScoreStride + key + 1] = s_acc[nt][3];
      }
    }
    __syncthreads();

    // 3. Online softmax: 16 threads per head row (lanes of one half-warp), 4 keys each.
    {
      const int head = tid / 16, part = tid % 16;
      float values[4];
      float block_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = part * 4 + i;
        const float sum = sh.s[0][head * kScoreStride + key] + sh.s[1][head * kScoreStride + key];
        values[i] = sh.slot_ids[buffer][key] >= 0 ? sum * scale_log2 : -INFINITY;
        block_max = fmaxf(block_max, values[i]);
      }
#pragma unroll
      for (int offset = 1; offset < 16; offset *= 2)
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, offset));
      const float old_max = sh.row_max[head];
      const float old_sum = sh.row_sum[head];
      __syncwarp();  // every lane has read the row state before part 0 rewrites it
      const float new_max = fmaxf(old_max, block_max);
      const bool empty = new_max == -INFINITY;  // nothing valid yet: avoid inf - inf
      float sum = 0.f;
      const float p0 = empty ? 0.f : exp2f(values[0] - new_max);
      const float p1 = empty ? 0.f : exp2f(values[1] - new_max);
      const float p2 = empty ? 0.f : exp2f(values[2] - new_max);
      const float p3 = empty ? 0.f : exp2f(values[3] - new_max);
      sum = (p0 + p1) + (p2 + p3);
      *reinterpret_cast<uint2*>(&sh.prob[head * kProbStride + part * 4]) =
          make_uint2(pack_half2(p0, p1), pack_half2(p2, p3));
#pragma unroll
      for (int offset = 1; offset < 16; offset *= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (part == 0) {
        const float factor = empty ? 1.f : exp2f(old_max - new_max);
        sh.row_max[head] = new_max;
        sh.row_sum[head] = old_sum * factor + sum;
        sh.row_factor[head] = factor;
      }
    }
    __syncthreads();

    // 4. O = O * factor + P V: 16 heads x 64 dims per warp, k = 64 keys.
    {
      const float factor_low = sh.row_factor[g];
      const float factor_high = sh.row_factor[g + 8];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        acc[n][0] *= factor_low;
        acc[n][1] *= factor_low;
        acc[n][2] *= factor_high;
        acc[n][3] *= factor_high;
      }
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks) {
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
    }
  }
  __syncthreads();  // every warp is done with K: its space now holds the state

  // This split's normalised output and lse into shared memory.
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
    if (tid < kHeads) {
      const float sum = sh.row_sum[tid];
      sh.state_lse[tid] = sum > 0.f ? sh.row_max[tid] + log2f(sum) : -INFINITY;
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
cudaLaunchConfig_t cluster_config(const SparseMlaParams& params, cudaLaunchAttribute& attribute,
                                  cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  const int heads = params.active_heads > 0 ? params.active_heads : params.heads;
  config.gridDim = dim3(static_cast<unsigned>(static_cast<int64_t>(params.rows) * kSplits),
                        static_cast<unsigned>(heads / kHeads));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(ClusterShared);
  config.stream = stream;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kSplits;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

template <int kSplits>
void launch(const SparseMlaParams& params, cudaStream_t stream) {
  static const bool configured = [] {
    configure<kSplits>(static_cast<int>(sizeof(ClusterShared)));
    return true;
  }();
  (void)configured;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config<kSplits>(params, attribute, stream);
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
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = cluster_config<16>(probe, attribute, nullptr);
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
