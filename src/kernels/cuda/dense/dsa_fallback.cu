// fp32 DSA fallback kernels; see dsa_fallback.h. Plain and quadratic where it
// keeps them obviously right (top-k by ranking): they define the parity mode
// and serve small contexts, the issue-7 kernels serve long ones.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/dense/dsa_fallback.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;

__device__ int64_t slot_of(const PagedRows& rows, int64_t token, int64_t position) {
  const int32_t* table = rows.page_tables + rows.table_offset[token];
  return static_cast<int64_t>(table[position / rows.page_size]) * rows.page_size +
         position % rows.page_size;
}

// Round-to-nearest-even bf16 bits of x (NaN stays a quiet NaN), as the host's
// float_to_bf16.
__device__ unsigned bf16_bits(float x) {
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// Value i of the entry at `slot`.
__device__ float load(const void* pool, const CacheLayout& layout, int64_t slot, int64_t i) {
  if (layout.dtype == CacheDType::F32)
    return static_cast<const float*>(pool)[slot * layout.width + i];
  if (layout.dtype == CacheDType::BF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(pool)[slot * layout.width + i]);
  }
  const uint8_t* entry = static_cast<const uint8_t*>(pool) + slot * layout.bytes();
  const int64_t scales = layout.fp8_count;
  const int64_t tail = scales + 4 * ((layout.fp8_count + 127) / 128);
  if (i >= layout.fp8_count) {
    const uint8_t* bytes = entry + tail + 2 * (i - layout.fp8_count);
    return __uint_as_float(
        (static_cast<unsigned>(bytes[0]) | (static_cast<unsigned>(bytes[1]) << 8)) << 16);
  }
  const uint8_t* bytes = entry + scales + 4 * (i / 128);
  const float scale = __uint_as_float(
      static_cast<unsigned>(bytes[0]) | (static_cast<unsigned>(bytes[1]) << 8) |
      (static_cast<unsigned>(bytes[2]) << 16) | (static_cast<unsigned>(bytes[3]) << 24));
  __nv_fp8_e4m3 code;
  code.__x = entry[i];
  return static_cast<float>(code) * scale;
}

__global__ void write_plain_kernel(void* pool, CacheLayout layout, PagedRows rows, int64_t tokens,
                                   const float* values, int64_t stride) {
  const int64_t width = layout.width;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < tokens * width;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t token = t / width, i = t % width;
    const int64_t index = slot_of(rows, token, rows.positions[token]) * width + i;
    const float value = values[token * stride + i];
    if (layout.dtype == CacheDType::F32) {
      static_cast<float*>(pool)[index] = value;
    } else {
      static_cast<__nv_bfloat16*>(pool)[index] = __float2bfloat16_rn(value);
    }
  }
}

// One thread per (token, 128-group) of the fp8 part, plus one per token for
// the bf16 tail: the same encoding as the host cache (kv_cache.cpp).
__global__ void write_fp8_kernel(void* pool, CacheLayout layout, PagedRows rows, int64_t tokens,
                                 const float* values, int64_t stride) {
  const int64_t groups = (layout.fp8_count + 127) / 128;
  const int64_t per_token = groups + 1;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < tokens * per_token;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t token = t / per_token, g = t % per_token;
    uint8_t* entry =
        static_cast<uint8_t*>(pool) + slot_of(rows, token, rows.positions[token]) * layout.bytes();
    const float* v = values + token * stride;
    if (g == groups) {  // the bf16 tail
      uint8_t* tail = entry + layout.fp8_count + 4 * groups;
      // Byte stores (entries are only byte-aligned, e.g. 52 B for a 32 + 8
      // latent) of bf16 bits made with integer arithmetic: with CUDA 13.0,
      // taking the low byte of a __nv_bfloat16 value (memcpy or
      // __bfloat16_as_ushort & 0xff) stored the value converted to a
      // saturated uint8 instead (cuda_kv_encoding_test caught it).
      for (int64_t i = layout.fp8_count; i < layout.width; ++i) {
        const unsigned bits = bf16_bits(v[i]);
        tail[2 * (i - layout.fp8_count)] = static_cast<uint8_t>(bits & 0xffu);
        tail[2 * (i - layout.fp8_count) + 1] = static_cast<uint8_t>(bits >> 8);
      }
      continue;
    }
    const int64_t begin = g * 128;
    const int64_t end = begin + 128 < layout.fp8_count ? begin + 128 : layout.fp8_count;
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = fmaxf(amax, fabsf(v[i]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t i = begin; i < end; ++i) entry[i] = __nv_fp8_e4m3(v[i] / scale).__x;
    const unsigned scale_bits = __float_as_uint(scale);
    for (int b = 0; b < 4; ++b)
      entry[layout.fp8_count + 4 * g + b] = static_cast<uint8_t>(scale_bits >> (8 * b));
  }
}

// One block per token; q[t] staged in shared memory ([heads * dim] floats).
__global__ void indexer_scores_kernel(IndexerFallbackParams p) {
  extern __shared__ float q[];
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < p.heads * p.dim; i += blockDim.x)
    q[i] = p.q[t * p.heads * p.dim + i];
  __syncthreads();
  const int64_t visible = p.rows.positions[t] + 1;
  const float* w = p.weights + t * p.heads;
  for (int64_t pos = threadIdx.x; pos < visible; pos += blockDim.x) {
    const int64_t slot = slot_of(p.rows, t, pos);
    float total = 0.0f;
    for (int64_t h = 0; h < p.heads; ++h) {
      float dot = 0.0f;
      for (int64_t d = 0; d < p.dim; ++d) dot += q[h * p.dim + d] * load(p.pool, p.layout, slot, d);
      const float value = dot * p.scale;
      if (value > 0.0f) total += w[h] * value;
    }
    p.scores[t * p.max_context + pos] = total;
  }
}

__device__ bool ranks_above(float va, int64_t a, float vb, int64_t b) {
  return va > vb || (va == vb && a < b);
}

// One block per token. Phase 1: every visible position with rank < topk goes
// to indices[rank] (ranks are distinct). Phase 2: those are reordered by
// position through shared memory ([topk] ints).
__global__ void topk_kernel(IndexerFallbackParams p) {
  extern __shared__ int32_t sorted[];
  const int64_t t = blockIdx.x;
  const int64_t visible = p.rows.positions[t] + 1;
  const float* s = p.scores + t * p.max_context;
  int32_t* out = p.indices + t * p.topk;
  const int64_t count = visible < p.topk ? visible : p.topk;
  for (int64_t pos = threadIdx.x; pos < visible; pos += blockDim.x) {
    int64_t rank = 0;
    for (int64_t o = 0; o < visible && rank < p.topk; ++o)
      rank += ranks_above(s[o], o, s[pos], pos);
    if (rank < p.topk) out[rank] = static_cast<int32_t>(pos);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const int32_t mine = out[i];
    int64_t before = 0;
    for (int64_t o = 0; o < count; ++o) before += out[o] < mine ? 1 : 0;
    sorted[before] = mine;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.topk; i += blockDim.x) out[i] = i < count ? sorted[i] : -1;
  if (threadIdx.x == 0) p.counts[t] = static_cast<int32_t>(count);
}

__device__ float block_reduce(float value, float* shared, bool use_max) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = use_max ? fmaxf(value, other) : value + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = use_max ? -FLT_MAX : 0.0f;
  for (int w = 0; w < kThreads / 32; ++w)
    total = use_max ? fmaxf(total, shared[w]) : total + shared[w];
  __syncthreads();
  return total;
}

// One block per (token, head). Shared: logits [index_stride] floats.
__global__ void mla_kernel(MlaFallbackParams p) {
  extern __shared__ float logits[];
  __shared__ float reduce[kThreads / 32];
  const int64_t t = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const float* ql = p.q_latent + (t * p.heads + h) * p.kv_lora;
  const float* qr = p.q_rope + t * p.rope_row_stride + h * p.rope_head_stride;
  const int32_t* selected = p.indices + t * p.index_stride;
  const int64_t count = p.counts[t];
  float* out = p.out + (t * p.heads + h) * p.kv_lora;
  // Logits: one warp per selected position.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t j = warp; j < count; j += kThreads / 32) {
    const int64_t slot = slot_of(p.rows, t, selected[j]);
    float dot = 0.0f;
    for (int64_t d = lane; d < p.kv_lora; d += 32) dot += ql[d] * load(p.pool, p.layout, slot, d);
    for (int64_t d = lane; d < p.rope; d += 32)
      dot += qr[d] * load(p.pool, p.layout, slot, p.kv_lora + d);
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (lane == 0) logits[j] = dot * p.scale;
  }
  __syncthreads();
  float local_max = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) local_max = fmaxf(local_max, logits[j]);
  const float max_logit = block_reduce(local_max, reduce, true);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    logits[j] = expf(logits[j] - max_logit);
    local_sum += logits[j];
  }
  const float denominator = block_reduce(local_sum, reduce, false);
  for (int64_t d = threadIdx.x; d < p.kv_lora; d += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j)
      acc += logits[j] * load(p.pool, p.layout, slot_of(p.rows, t, selected[j]), d);
    out[d] = count == 0 ? 0.0f : acc / denominator;
  }
}

int blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace

void write_cache_rows(void* pool, const CacheLayout& layout, const PagedRows& rows, int64_t tokens,
                      const float* values, int64_t stride, cudaStream_t stream) {
  if (tokens == 0) return;
  if (layout.dtype == CacheDType::FP8) {
    const int64_t per_token = (layout.fp8_count + 127) / 128 + 1;
    write_fp8_kernel<<<blocks_for(tokens * per_token), kThreads, 0, stream>>>(
        pool, layout, rows, tokens, values, stride);
  } else {
    write_plain_kernel<<<blocks_for(tokens * layout.width), kThreads, 0, stream>>>(
        pool, layout, rows, tokens, values, stride);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void indexer_topk_fallback(const IndexerFallbackParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const size_t q_bytes = static_cast<size_t>(p.heads * p.dim) * sizeof(float);
  indexer_scores_kernel<<<static_cast<unsigned>(p.tokens), kThreads, q_bytes, stream>>>(p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  const size_t sort_bytes = static_cast<size_t>(p.topk) * sizeof(int32_t);
  topk_kernel<<<static_cast<unsigned>(p.tokens), kThreads, sort_bytes, stream>>>(p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void mla_attention_fallback(const MlaFallbackParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const size_t bytes = static_cast<size_t>(p.index_stride) * sizeof(float);
  mla_kernel<<<static_cast<unsigned>(p.tokens * p.heads), kThreads, bytes, stream>>>(p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
