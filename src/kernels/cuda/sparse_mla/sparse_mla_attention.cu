// Sparse MLA attention kernel (bf16 tensor cores, fp32 softmax state) and the
// split merge. One CTA = one query row x 64 heads x one split of its slots.
//
// Per block of 32 slots:
//   1. gather + dequantise the 32 latent entries into K[32][576] bf16 (smem);
//   2. S[64 heads][32] = Q[64][576] . K^T      warp w: heads 16*(w%4).., keys 16*(w/4)..
//   3. online softmax per head row (4 threads per row), P bf16 in smem;
//   4. O[64][512] += P[64][32] . K[:, :512]    warp w: heads 16*(w%4).., dims 256*(w/4)..
// K doubles as V (MLA: the value is the latent itself), read transposed by
// ldmatrix.trans. Row strides are padded by 16 bytes so that ldmatrix rows
// fall in distinct banks.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeads = kSparseMlaHeadBlock;  // 64
constexpr int kKeys = kSparseMlaKeyBlock;    // 32
constexpr int kDim = kSparseMlaQueryDim;     // 576
constexpr int kStride = kDim + 8;            // bf16 per Q/K row in smem
constexpr int kScoreStride = kKeys + 1;      // fp32 per S row
constexpr int kProbStride = kKeys + 8;       // bf16 per P row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct SharedLayout {
  __nv_bfloat16 q[kHeads * kStride];
  __nv_bfloat16 k[kKeys * kStride];
  float s[kHeads * kScoreStride];
  __nv_bfloat16 prob[kHeads * kProbStride];
  float row_max[kHeads];
  float row_sum[kHeads];
  float row_factor[kHeads];
  int valid[kKeys];
};

__global__ void __launch_bounds__(kThreads, 1) sparse_mla_kernel(SparseMlaParams p) {
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
  const float scale_log2 = p.softmax_scale * kLog2e;

  // Q block [64 heads][576] -> smem, 16-byte pieces.
  const uint16_t* q_source = p.q + (row * p.heads + head0) * kDim;
  for (int i = tid; i < kHeads * (kDim / 8); i += kThreads) {
    const int head = i / (kDim / 8), piece = i % (kDim / 8);
    *reinterpret_cast<uint4*>(&sh.q[head * kStride + piece * 8]) =
        *reinterpret_cast<const uint4*>(q_source + head * kDim + piece * 8);
  }
  if (tid < kHeads) {
    sh.row_max[tid] = -INFINITY;
    sh.row_sum[tid] = 0.f;
  }
  const int m_tile = warp % 4;  // heads 16*m_tile .. +16 in both GEMMs
  const int n_half = warp / 4;  // S: keys 16*n_half..; O: dims 256*n_half..
  float acc[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  __syncthreads();

  const int32_t* row_slots = p.slots + row * p.top_k;
  for (int key0 = key_begin; key0 < key_end; key0 += kKeys) {
    // 1. Gather: thread -> (key tid/8, eighth tid%8): 64 latent values + 8 rope values.
    {
      const int key = tid / 8, part = tid % 8;
      const int32_t slot = key0 + key < key_end ? row_slots[key0 + key] : -1;
      __nv_bfloat16* destination = &sh.k[key * kStride];
      if (slot >= 0) {
        const uint8_t* entry = p.kv_pool + static_cast<int64_t>(slot) * kLatentBytes;
        const float scale =
            *reinterpret_cast<const float*>(entry + kLatentScaleOffset + (part / 2) * 4);
#pragma unroll
        for (int piece = 0; piece < 4; ++piece) {
          const uint4 bytes = *reinterpret_cast<const uint4*>(entry + part * 64 + piece * 16);
          const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
          uint32_t packed[8];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            float values[4];
            e4m3x4_to_float(words[w], values);
            packed[2 * w] = pack_bf16x2(values[0] * scale, values[1] * scale);
            packed[2 * w + 1] = pack_bf16x2(values[2] * scale, values[3] * scale);
          }
          uint4* out = reinterpret_cast<uint4*>(destination + part * 64 + piece * 16);
          out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
          out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        }
        *reinterpret_cast<uint4*>(destination + kLatentRank + part * 8) =
            *reinterpret_cast<const uint4*>(entry + kLatentRopeOffset + part * 16);
      } else {
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int piece = 0; piece < 8; ++piece)
          *reinterpret_cast<uint4*>(destination + part * 64 + piece * 8) = zero;
        *reinterpret_cast<uint4*>(destination + kLatentRank + part * 8) = zero;
      }
      if (part == 0) sh.valid[key] = slot >= 0;
    }
    __syncthreads();

    // 2. S = Q K^T for 16 heads x 16 keys per warp, k = 576 in 36 steps.
    {
      float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const __nv_bfloat16* a_row = &sh.q[(m_tile * 16 + lane % 16) * kStride + (lane / 16) * 8];
      const __nv_bfloat16* b_row =
          &sh.k[(n_half * 16 + lane % 8 + (lane / 16) * 8) * kStride + ((lane / 8) % 2) * 8];
#pragma unroll 4
      for (int ks = 0; ks < kDim / 16; ++ks) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, a_row + ks * 16);
        ldmatrix_x4(b, b_row + ks * 16);
        mma_bf16_16x8x16(s_acc[0], a, b[0], b[1]);
        mma_bf16_16x8x16(s_acc[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = n_half * 16 + nt * 8 + 2 * t;
        const bool valid0 = sh.valid[key], valid1 = sh.valid[key + 1];
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
      const float new_max = fmaxf(old_max, block_max);
      const bool empty = new_max == -INFINITY;  // nothing valid yet: avoid inf - inf
      float sum = 0.f;
      uint32_t packed[4];
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const float p0 = empty ? 0.f : exp2f(values[i] - new_max);
        const float p1 = empty ? 0.f : exp2f(values[i + 1] - new_max);
        sum += p0 + p1;
        packed[i / 2] = pack_bf16x2(p0, p1);
      }
      *reinterpret_cast<uint4*>(&sh.prob[head * kProbStride + quarter * 8]) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (quarter == 0) {
        const float factor = empty ? 1.f : exp2f(old_max - new_max);
        sh.row_max[head] = new_max;
        sh.row_sum[head] = sh.row_sum[head] * factor + sum;
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
        const __nv_bfloat16* v_row = &sh.k[(ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride +
                                           n_half * 256 + (lane / 16) * 8];
#pragma unroll
        for (int np = 0; np < 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_row + np * 16);
          mma_bf16_16x8x16(acc[2 * np], a, b[0], b[1]);
          mma_bf16_16x8x16(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // K, S and P are rewritten by the next block
  }

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

// One CTA of 128 threads per (row, head): 4 output dims per thread.
__global__ void __launch_bounds__(128) sparse_mla_merge_kernel(SparseMlaParams p) {
  const int64_t row = blockIdx.x / p.heads;
  const int head = static_cast<int>(blockIdx.x % p.heads);
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
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  uint16_t* destination = p.out + (row * p.heads + head) * kLatentRank + threadIdx.x * 4;
  *reinterpret_cast<uint2*>(destination) =
      make_uint2(pack_bf16x2(out[0] * inverse, out[1] * inverse),
                 pack_bf16x2(out[2] * inverse, out[3] * inverse));
  if (threadIdx.x == 0)
    p.lse[row * p.heads + head] = total > 0.f ? max_lse + logf(total) : -INFINITY;
}

}  // namespace

namespace detail {

void launch_sparse_mla(const SparseMlaParams& params, cudaStream_t stream) {
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
  sparse_mla_kernel<<<grid, kThreads, shared_bytes, stream>>>(params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  if (params.num_splits > 1) {
    sparse_mla_merge_kernel<<<
        static_cast<unsigned>(static_cast<int64_t>(params.rows) * params.heads), 128, 0, stream>>>(
        params);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace detail
}  // namespace megactx::cuda
