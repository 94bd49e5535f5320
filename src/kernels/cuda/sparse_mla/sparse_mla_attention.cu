// Sparse MLA attention kernel (f16 tensor cores, fp32 softmax state) and the
// split merge. One CTA = one query row x 64 heads x one split of its slots.
//
// Per block of 32 slots:
//   1. dequantise the block's 32 raw latent entries (fetched by cp.async one
//      block ahead into a staging buffer; slot ids two blocks ahead) into
//      K[32][576] f16;
//   2. S[64 heads][32] = Q[64][576] . K^T      warp w: heads 16*(w%4).., keys 16*(w/4)..
//   3. online softmax per head row (4 threads per row), P f16 in smem;
//   4. O[64][512] += P[64][32] . K[:, :512]    warp w: heads 16*(w%4).., dims 256*(w/4)..
// Operands are f16: e4m3 converts to f16 exactly in one instruction (bf16 would
// need a float round trip per element, which made the dequantisation cost more
// than the MMAs), the group scale is one f16 multiply, and Q is stored times
// 2^-6 (folded back into the softmax scale) so |q| up to 4e6 fits f16.
// K doubles as V (MLA: the value is the latent itself), read transposed by
// ldmatrix.trans. Row strides are padded by 16 bytes so that ldmatrix rows
// fall in distinct banks.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/sparse_mla/latent_convert.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeads = kSparseMlaHeadBlock;  // 64
constexpr int kKeys = kSparseMlaKeyBlock;    // 32
constexpr int kDim = kSparseMlaQueryDim;     // 576
constexpr int kStride = kDim + 8;            // f16 per Q/K row in smem
constexpr int kScoreStride = kKeys + 1;      // fp32 per S row
constexpr int kProbStride = kKeys + 8;       // f16 per P row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kQueryPrescale = 1.f / 64.f;

constexpr int kEntryPieces = kLatentBytes / 16;  // 41 16-byte pieces per entry

struct SharedLayout {
  __half q[kHeads * kStride];
  __half k[kKeys * kStride];
  uint8_t raw[2][kKeys * kLatentBytes];  // staged fp8 entries of the next block
  int32_t slot_ids[3][kKeys];            // slot ids of blocks j, j+1, j+2
  float s[kHeads * kScoreStride];
  __half prob[kHeads * kProbStride];
  float row_max[kHeads];
  float row_sum[kHeads];
  float row_factor[kHeads];
};

__global__ void __launch_bounds__(kThreads, 1) sparse_mla_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  SharedLayout& sh = *reinterpret_cast<SharedLayout*>(shared_bytes);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row = blockIdx.x / p.num_splits;
  const int split = static_cast<int>(blockIdx.x % p.num_splits);
  const int head0 = blockIdx.y * kHeads;
  const int total_blocks = (p.top_k + kKeys - 1) / kKeys;
  const int blocks_per_split = (total_blocks + p.num_splits - 1) / p.num_splits;
  const int key_begin = split * blocks_per_split * kKeys;
  const int key_end = min(p.top_k, key_begin + blocks_per_split * kKeys);
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;

  const int32_t* row_slots = p.slots + row * p.top_k;
  // Slot ids of the block starting at key0, one per thread of warp 0 (-1 past
  // the split); read a block ahead of their smem store to hide the latency.
  auto read_slot_id = [&](int key0) -> int32_t {
    return tid < kKeys && key0 + tid < key_end ? row_slots[key0 + tid] : -1;
  };
  // Raw entries of the block whose ids are in slot_ids[buffer] -> raw[stage].
  auto fetch_entries = [&](int buffer, int stage) {
    for (int piece = tid; piece < kKeys * kEntryPieces; piece += kThreads) {
      const int key = piece / kEntryPieces, offset = (piece % kEntryPieces) * 16;
      const int32_t slot = sh.slot_ids[buffer][key];
      if (slot >= 0)
        cp_async_16(&sh.raw[stage][key * kLatentBytes + offset], latent_entry(p, slot) + offset);
    }
    cp_async_commit();
  };

  // Q block [64 heads][576] bf16 -> f16 * 2^-6 in smem: 18 pieces of 16 bytes
  // per thread, loaded in two batches so that the loads overlap.
  const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
  constexpr int kQueryPieces = kHeads * (kDim / 8) / kThreads;  // 18
  static_assert(kHeads * (kDim / 8) % kThreads == 0 && kQueryPieces % 2 == 0);
#pragma unroll
  for (int batch = 0; batch < 2; ++batch) {
    uint4 raw[kQueryPieces / 2];
#pragma unroll
    for (int r = 0; r < kQueryPieces / 2; ++r) {
      const int i = tid + (batch * kQueryPieces / 2 + r) * kThreads;
      raw[r] = *reinterpret_cast<const uint4*>(q_source + (i / (kDim / 8)) * kDim +
                                               (i % (kDim / 8)) * 8);
    }
#pragma unroll
    for (int r = 0; r < kQueryPieces / 2; ++r) {
      const int i = tid + (batch * kQueryPieces / 2 + r) * kThreads;
      store_bf16x8_as_half(raw[r], kQueryPrescale,
                           &sh.q[(i / (kDim / 8)) * kStride + (i % (kDim / 8)) * 8]);
    }
  }
  if (tid < kHeads) {
    sh.row_max[tid] = -INFINITY;
    sh.row_sum[tid] = 0.f;
  }
  if (tid < kKeys) {
    sh.slot_ids[0][tid] = read_slot_id(key_begin);
    sh.slot_ids[1][tid] = read_slot_id(key_begin + kKeys);
  }
  int32_t pending_slot = read_slot_id(key_begin + 2 * kKeys);
  __syncthreads();
  fetch_entries(0, 0);
  const int m_tile = warp % 4;  // heads 16*m_tile .. +16 in both GEMMs
  const int n_half = warp / 4;  // S: keys 16*n_half..; O: dims 256*n_half..
  float acc[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  __syncthreads();

  int block = 0;
  for (int key0 = key_begin; key0 < key_end; key0 += kKeys, ++block) {
    // Prefetch: entries of block + 1, ids of block + 2 (read last iteration) to
    // smem, ids of block + 3 into a register.
    __syncthreads();
    fetch_entries((block + 1) % 3, (block + 1) % 2);
    if (tid < kKeys) sh.slot_ids[(block + 2) % 3][tid] = pending_slot;
    pending_slot = read_slot_id(key0 + 3 * kKeys);
    cp_async_wait<1>();  // this thread's copies of this block (and Q) have landed
    __syncthreads();

    // 1. Dequantise: thread -> (key tid/8, eighth tid%8): 64 latent values + 8 rope values.
    {
      const int key = tid / 8, part = tid % 8;
      const int32_t slot = sh.slot_ids[block % 3][key];
      __half* destination = &sh.k[key * kStride];
      if (slot >= 0) {
        const uint8_t* entry = &sh.raw[block % 2][key * kLatentBytes];
        const __half2 scale = __float2half2_rn(
            *reinterpret_cast<const float*>(entry + kLatentScaleOffset + (part / 2) * 4));
#pragma unroll
        for (int piece = 0; piece < 4; ++piece) {
          const uint4 bytes = *reinterpret_cast<const uint4*>(entry + part * 64 + piece * 16);
          store_e4m3x16_as_half(bytes, scale, destination + part * 64 + piece * 16);
        }
        // Rope: 8 bf16 -> 8 f16.
        const uint4 rope = *reinterpret_cast<const uint4*>(entry + kLatentRopeOffset + part * 16);
        store_bf16x8_as_half(rope, 1.f, destination + kLatentRank + part * 8);
      } else {
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int piece = 0; piece < 8; ++piece)
          *reinterpret_cast<uint4*>(destination + part * 64 + piece * 8) = zero;
        *reinterpret_cast<uint4*>(destination + kLatentRank + part * 8) = zero;
      }
    }
    __syncthreads();

    // 2. S = Q K^T for 16 heads x 16 keys per warp, k = 576 in 36 steps.
    {
      float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const __half* a_row = &sh.q[(m_tile * 16 + lane % 16) * kStride + (lane / 16) * 8];
      const __half* b_row =
          &sh.k[(n_half * 16 + lane % 8 + (lane / 16) * 8) * kStride + ((lane / 8) % 2) * 8];
#pragma unroll 4
      for (int ks = 0; ks < kDim / 16; ++ks) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, a_row + ks * 16);
        ldmatrix_x4(b, b_row + ks * 16);
        mma_f16_16x8x16(s_acc[0], a, b[0], b[1]);
        mma_f16_16x8x16(s_acc[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = n_half * 16 + nt * 8 + 2 * t;
        const bool valid0 = sh.slot_ids[block % 3][key] >= 0,
                   valid1 = sh.slot_ids[block % 3][key + 1] >= 0;
        float* s_low = &sh.s[(m_tile * 16 + g) * kScoreStride + key];
        float* s_high = s_low + 8 * kScoreStride;
        s_low[0] = valid0 ? s_acc[nt][0] * scale_log2 : -INFINITY;
        s_low[1] = valid1 ? s_acc[nt][1] * scale_log2 : -INFINITY;
        s_high[0] = valid0 ? s_acc[nt][2] * scale_log2 : -INFINITY;
        s_high[1] = valid1 ? s_acc[nt][3] * scale_log2 : -INFINITY;
      }
    }
    __syncthreads();

    // 3. Online softmax (log2 domain): 4 threads per head row, 8 keys each.
    {
      const int head = tid / 4, quarter = tid % 4;
      float values[8];
      float block_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        values[i] = sh.s[head * kScoreStride + quarter * 8 + i];
        block_max = fmaxf(block_max, values[i]);
      }
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      const float old_max = sh.row_max[head];
      const float old_sum = sh.row_sum[head];
      __syncwarp();  // every lane has read the row state before lane quarter 0 rewrites it
      const float new_max = fmaxf(old_max, block_max);
      const bool empty = new_max == -INFINITY;  // nothing valid yet: avoid inf - inf
      float sum = 0.f;
      uint32_t packed[4];
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const float p0 = empty ? 0.f : exp2f(values[i] - new_max);
        const float p1 = empty ? 0.f : exp2f(values[i + 1] - new_max);
        sum += p0 + p1;
        packed[i / 2] = pack_half2(p0, p1);
      }
      *reinterpret_cast<uint4*>(&sh.prob[head * kProbStride + quarter * 8]) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (quarter == 0) {
        const float factor = empty ? 1.f : exp2f(old_max - new_max);
        sh.row_max[head] = new_max;
        sh.row_sum[head] = old_sum * factor + sum;
        sh.row_factor[head] = factor;
      }
    }
    __syncthreads();

    // 4. O = O * factor + P V for 16 heads x 256 dims per warp.
    {
      const float factor_low = sh.row_factor[m_tile * 16 + g];
      const float factor_high = sh.row_factor[m_tile * 16 + g + 8];
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        acc[n][0] *= factor_low;
        acc[n][1] *= factor_low;
        acc[n][2] *= factor_high;
        acc[n][3] *= factor_high;
      }
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a,
                    &sh.prob[(m_tile * 16 + lane % 16) * kProbStride + ks * 16 + (lane / 16) * 8]);
        const __half* v_row = &sh.k[(ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride +
                                    n_half * 256 + (lane / 16) * 8];
#pragma unroll
        for (int np = 0; np < 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_row + np * 16);
          mma_f16_16x8x16(acc[2 * np], a, b[0], b[1]);
          mma_f16_16x8x16(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Finalise: normalise, then write the output (one split) or a partial state.
  const int head_low = m_tile * 16 + g, head_high = head_low + 8;
  const float sum_low = sh.row_sum[head_low], sum_high = sh.row_sum[head_high];
  const float inverse_low = sum_low > 0.f ? 1.f / sum_low : 0.f;
  const float inverse_high = sum_high > 0.f ? 1.f / sum_high : 0.f;
  const int dim0 = n_half * 256 + 2 * t;
  if (p.num_splits == 1) {
    uint16_t* out_low = p.out + (row * p.heads + head0 + head_low) * kLatentRank + dim0;
    uint16_t* out_high = p.out + (row * p.heads + head0 + head_high) * kLatentRank + dim0;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<uint32_t*>(out_low + n * 8) =
          pack_bf16x2(acc[n][0] * inverse_low, acc[n][1] * inverse_low);
      *reinterpret_cast<uint32_t*>(out_high + n * 8) =
          pack_bf16x2(acc[n][2] * inverse_high, acc[n][3] * inverse_high);
    }
  } else {
    const int64_t state = (row * p.num_splits + split) * p.heads + head0;
    float* out_low = p.partial_out + (state + head_low) * kLatentRank + dim0;
    float* out_high = p.partial_out + (state + head_high) * kLatentRank + dim0;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<float2*>(out_low + n * 8) =
          make_float2(acc[n][0] * inverse_low, acc[n][1] * inverse_low);
      *reinterpret_cast<float2*>(out_high + n * 8) =
          make_float2(acc[n][2] * inverse_high, acc[n][3] * inverse_high);
    }
  }
  if (tid < kHeads) {
    const float sum = sh.row_sum[tid];
    const float lse = sum > 0.f ? (sh.row_max[tid] + log2f(sum)) * kLn2 : -INFINITY;
    if (p.num_splits == 1)
      p.lse[row * p.heads + head0 + tid] = lse;
    else
      p.partial_lse[(row * p.num_splits + split) * p.heads + head0 + tid] = lse;
  }
}

// The heads a merge combines: [0, active_heads) when set (a model with fewer
// heads than its q layout is padded to: glm_1b's 16 of 64; the padded heads'
// out / lse stay unwritten), else all of them.
__host__ __device__ __forceinline__ int merged_heads(const SparseMlaParams& p) {
  return p.active_heads > 0 ? p.active_heads : p.heads;
}

// A merge's result: this thread's 4 output dims of (row, head) normalised,
// and the head's lse.
__device__ __forceinline__ void write_merged(const SparseMlaParams& p, int64_t row, int head,
                                             const float (&out)[4], float total, float max_lse) {
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  uint16_t* destination = p.out + (row * p.heads + head) * kLatentRank + threadIdx.x * 4;
  *reinterpret_cast<uint2*>(destination) =
      make_uint2(pack_bf16x2(out[0] * inverse, out[1] * inverse),
                 pack_bf16x2(out[2] * inverse, out[3] * inverse));
  if (threadIdx.x == 0)
    p.lse[row * p.heads + head] = total > 0.f ? max_lse + logf(total) : -INFINITY;
}

// One CTA of 128 threads per (row, head): 4 output dims per thread.
__global__ void __launch_bounds__(128) sparse_mla_merge_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int merged = merged_heads(p);
  const int64_t row = blockIdx.x / merged;
  const int head = static_cast<int>(blockIdx.x % merged);
  float max_lse = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s)
    max_lse = fmaxf(max_lse, p.partial_lse[(row * p.num_splits + s) * p.heads + head]);
  float total = 0.f;
  float out[4] = {0.f, 0.f, 0.f, 0.f};
  if (max_lse != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const int64_t state = (row * p.num_splits + s) * p.heads + head;
      const float weight = __expf(p.partial_lse[state] - max_lse);
      if (weight == 0.f) continue;
      total += weight;
      const float4 part =
          *reinterpret_cast<const float4*>(p.partial_out + state * kLatentRank + threadIdx.x * 4);
      out[0] += weight * part.x;
      out[1] += weight * part.y;
      out[2] += weight * part.z;
      out[3] += weight * part.w;
    }
  }
  write_merged(p, row, head, out, total, max_lse);
}

// sparse_mla_merge_kernel's sums in the same order (so the same bits), without
// its chain of dependent loads: a split's lse, then its weight, then its
// partial row, one split after another (ncu: 9 us per launch at one decode
// row and 32 splits, for 4 MB). Here the CTA's threads read every split's lse
// into shared memory at once, and each thread loads its partial rows of
// kMergeBatch splits before it accumulates them in split order.
constexpr int kMergeMaxSplits = 64;  // ceil(2048 / 32)
constexpr int kMergeBatch = 8;

__global__ void __launch_bounds__(128) sparse_mla_merge_prefetch_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ float split_lse[kMergeMaxSplits];
  const int merged = merged_heads(p);
  const int64_t row = blockIdx.x / merged;
  const int head = static_cast<int>(blockIdx.x % merged);
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x)
    split_lse[s] = p.partial_lse[(row * p.num_splits + s) * p.heads + head];
  __syncthreads();
  float max_lse = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) max_lse = fmaxf(max_lse, split_lse[s]);
  float total = 0.f;
  float out[4] = {0.f, 0.f, 0.f, 0.f};
  if (max_lse != -INFINITY) {
    for (int s0 = 0; s0 < p.num_splits; s0 += kMergeBatch) {
      float weight[kMergeBatch];
      float4 part[kMergeBatch];
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        const int s = s0 + i;
        weight[i] = s < p.num_splits ? __expf(split_lse[s] - max_lse) : 0.f;
        part[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (weight[i] != 0.f) {
          const int64_t state = (row * p.num_splits + s) * p.heads + head;
          part[i] = *reinterpret_cast<const float4*>(p.partial_out + state * kLatentRank +
                                                     threadIdx.x * 4);
        }
      }
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        if (weight[i] == 0.f) continue;
        total += weight[i];
        out[0] += weight[i] * part[i].x;
        out[1] += weight[i] * part[i].y;
        out[2] += weight[i] * part[i].z;
        out[3] += weight[i] * part[i].w;
      }
    }
  }
  write_merged(p, row, head, out, total, max_lse);
}

}  // namespace

namespace detail {

void launch_sparse_mla(const SparseMlaParams& params, cudaStream_t stream) {
  launch_sparse_mla(params, kSparseMlaPrefetchMerge, stream);
}

void launch_sparse_mla(const SparseMlaParams& params, bool prefetch_merge, cudaStream_t stream) {
  if (params.rows == 0) return;
  constexpr int shared_bytes = sizeof(SharedLayout);
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
        sparse_mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(params.rows) * params.num_splits),
                  static_cast<unsigned>(params.heads / kHeads));
  launch_kernel(sparse_mla_kernel, grid, kThreads, shared_bytes, stream, params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  if (params.num_splits > 1) launch_sparse_mla_merge(params, prefetch_merge, stream);
}

void launch_sparse_mla_merge(const SparseMlaParams& params, cudaStream_t stream) {
  launch_sparse_mla_merge(params, kSparseMlaPrefetchMerge, stream);
}

void launch_sparse_mla_merge(const SparseMlaParams& params, bool prefetch_merge,
                             cudaStream_t stream) {
  const unsigned merges =
      static_cast<unsigned>(static_cast<int64_t>(params.rows) * merged_heads(params));
  if (prefetch_merge && params.num_splits <= kMergeMaxSplits) {
    launch_kernel(sparse_mla_merge_prefetch_kernel, merges, 128, 0, stream, params);
  } else {
    launch_kernel(sparse_mla_merge_kernel, merges, 128, 0, stream, params);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
