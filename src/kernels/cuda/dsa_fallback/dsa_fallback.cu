// fp32 DSA fallback kernels; see dsa_fallback.h. Plain where it keeps them
// obviously right: they define the parity mode and serve every model the
// fp8 DSA kernels do not. The top-k is the radix select of position_topk.h.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/dsa_fallback/dsa_fallback.h"
#include "kernels/cuda/dsa_fallback/position_topk.h"

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
    if (rows.positions[token] < 0) continue;  // a padding row writes nothing
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
    if (rows.positions[token] < 0) continue;  // a padding row writes nothing
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

// Blocks (token, chunk of kThreads positions); q[t] staged in shared memory
// ([heads * dim] floats). The chunks spread one token's keys over many SMs
// (a single decode token would otherwise run on one).
__global__ void indexer_scores_kernel(IndexerFallbackParams p) {
  extern __shared__ float q[];
  const int64_t t = blockIdx.x;
  const int64_t visible = p.rows.positions[t] + 1;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x;
  if (first >= visible) return;
  for (int64_t i = threadIdx.x; i < p.heads * p.dim; i += blockDim.x)
    q[i] = p.q[t * p.heads * p.dim + i];
  __syncthreads();
  const float* w = p.weights + t * p.heads;
  for (int64_t pos = first + threadIdx.x; pos < visible && pos < first + blockDim.x;
       pos += blockDim.x) {
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

// One block per (token, head); its 8 warps split the selected keys. Each warp
// walks its keys once with an online softmax (running max m, sum l, output
// acc): lane l owns the latent dims l, l + 32, ... (at most 16 of them, so
// kv_lora <= 512) and the rope dims l, l + 32 (rope <= 64), so the c_kv
// values it loads for the logit are the ones it accumulates. The warps' states
// merge in shared memory at the end ([8][512] floats).
constexpr int kMlaWarps = kThreads / 32;
constexpr int kMlaMaxLatentPerLane = 16;  // kv_lora <= 512
constexpr int kMlaMaxRopePerLane = 2;     // rope <= 64

__global__ void mla_kernel(MlaFallbackParams p) {
  __shared__ float warp_acc[kMlaWarps][kMlaMaxLatentPerLane * 32];
  __shared__ float warp_max[kMlaWarps], warp_sum[kMlaWarps];
  const int64_t t = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* ql = p.q_latent + (t * p.heads + h) * p.kv_lora;
  const float* qr = p.q_rope + t * p.rope_row_stride + h * p.rope_head_stride;
  const int32_t* selected = p.indices + t * p.index_stride;
  const int64_t count = p.counts[t];
  float q_latent[kMlaMaxLatentPerLane], q_rope[kMlaMaxRopePerLane], acc[kMlaMaxLatentPerLane];
#pragma unroll
  for (int i = 0; i < kMlaMaxLatentPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    q_latent[i] = d < p.kv_lora ? ql[d] : 0.0f;
    acc[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kMlaMaxRopePerLane; ++i) {
    const int64_t d = lane + 32 * i;
    q_rope[i] = d < p.rope ? qr[d] : 0.0f;
  }
  float running_max = -FLT_MAX, running_sum = 0.0f;
  for (int64_t j = warp; j < count; j += kMlaWarps) {
    const int64_t slot = slot_of(p.rows, t, selected[j]);
    float c_kv[kMlaMaxLatentPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMlaMaxLatentPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      c_kv[i] = d < p.kv_lora ? load(p.pool, p.layout, slot, d) : 0.0f;
      dot += q_latent[i] * c_kv[i];
    }
#pragma unroll
    for (int i = 0; i < kMlaMaxRopePerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < p.rope) dot += q_rope[i] * load(p.pool, p.layout, slot, p.kv_lora + d);
    }
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float logit = dot * p.scale;
    const float new_max = fmaxf(running_max, logit);
    const float correction = expf(running_max - new_max);
    const float weight = expf(logit - new_max);
    running_sum = running_sum * correction + weight;
#pragma unroll
    for (int i = 0; i < kMlaMaxLatentPerLane; ++i) acc[i] = acc[i] * correction + weight * c_kv[i];
    running_max = new_max;
  }
#pragma unroll
  for (int i = 0; i < kMlaMaxLatentPerLane; ++i) warp_acc[warp][lane + 32 * i] = acc[i];
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
  __syncthreads();
  float total_max = -FLT_MAX;
  for (int w = 0; w < kMlaWarps; ++w) total_max = fmaxf(total_max, warp_max[w]);
  float scales[kMlaWarps];
  float denominator = 0.0f;
  for (int w = 0; w < kMlaWarps; ++w) {
    // A warp that saw no key keeps max -FLT_MAX and sum 0: its scale is 0.
    scales[w] = warp_sum[w] > 0.0f ? expf(warp_max[w] - total_max) : 0.0f;
    denominator += scales[w] * warp_sum[w];
  }
  float* out = p.out + (t * p.heads + h) * p.kv_lora;
  for (int64_t d = threadIdx.x; d < p.kv_lora; d += kThreads) {
    float value = 0.0f;
    for (int w = 0; w < kMlaWarps; ++w) value += scales[w] * warp_acc[w][d];
    out[d] = count == 0 ? 0.0f : value / denominator;
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
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.max_context + kThreads - 1) / kThreads));
  indexer_scores_kernel<<<grid, kThreads, q_bytes, stream>>>(p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  PositionTopkParams select;
  select.scores = p.scores;
  select.score_stride = p.max_context;
  select.positions = p.rows.positions;
  select.rows = p.tokens;
  select.topk = p.topk;
  select.max_context = p.max_context;
  select.indices = p.indices;
  select.counts = p.counts;
  position_topk(select, stream);
}

void mla_attention_fallback(const MlaFallbackParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  // kv_lora <= 512 and rope <= 64: checked by the CUDA model's constructor.
  mla_kernel<<<static_cast<unsigned>(p.tokens * p.heads), kThreads, 0, stream>>>(p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
