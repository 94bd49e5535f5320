// fp32 DSA fallback kernels; see dsa_fallback.h. Plain where it keeps them
// obviously right: they define the parity mode and serve every model the
// fp8 DSA kernels do not. The top-k is the radix select of position_topk.h.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/row_ops.cuh"
#include "kernels/cuda/dsa_fallback/dsa_fallback.h"
#include "kernels/cuda/dsa_fallback/position_topk.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"

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

// An fp8 group's float32 scale from its 4 little-endian bytes (entries are
// only byte-aligned).
__device__ __forceinline__ float load_scale(const uint8_t* bytes) {
  return __uint_as_float(static_cast<unsigned>(bytes[0]) | (static_cast<unsigned>(bytes[1]) << 8) |
                         (static_cast<unsigned>(bytes[2]) << 16) |
                         (static_cast<unsigned>(bytes[3]) << 24));
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
  const float scale = load_scale(entry + scales + 4 * (i / 128));
  __nv_fp8_e4m3 code;
  code.__x = entry[i];
  return static_cast<float>(code) * scale;
}

__global__ void write_plain_kernel(void* pool, CacheLayout layout, PagedRows rows, int64_t tokens,
                                   const float* values, int64_t stride) {
  grid_dependency_wait();
  grid_dependency_trigger();
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

// Values [first, width) of an FP8 entry's bf16 tail, every `step`-th, into
// `tail`. Byte stores (entries are only byte-aligned, e.g. 52 B for a 32 + 8
// latent) of bf16 bits made with integer arithmetic: with CUDA 13.0, taking
// the low byte of a __nv_bfloat16 value (memcpy or __bfloat16_as_ushort &
// 0xff) stored the value converted to a saturated uint8 instead
// (cuda_kv_encoding_test caught it).
__device__ void store_bf16_tail(uint8_t* tail, const float* v, const CacheLayout& layout,
                                int64_t first, int64_t step) {
  for (int64_t i = first; i < layout.width; i += step) {
    const unsigned bits = bf16_bits(v[i]);
    tail[2 * (i - layout.fp8_count)] = static_cast<uint8_t>(bits & 0xffu);
    tail[2 * (i - layout.fp8_count) + 1] = static_cast<uint8_t>(bits >> 8);
  }
}

// One thread per (token, 128-group) of the fp8 part, plus one per token for
// the bf16 tail: the same encoding as the host cache (kv_cache.cpp).
__global__ void write_fp8_kernel(void* pool, CacheLayout layout, PagedRows rows, int64_t tokens,
                                 const float* values, int64_t stride) {
  grid_dependency_wait();
  grid_dependency_trigger();
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
      store_bf16_tail(tail, v, layout, layout.fp8_count, 1);
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

// 128-value group g of an FP8 entry by one warp (every lane calls it): each
// lane quantises 4 values, the group's amax is a warp reduction, the codes go
// out as one 4-byte store per lane, lane 0 stores the scale. The same bytes as
// write_fp8_kernel's thread-per-group loop. entry and the group 4-byte aligned.
__device__ void store_fp8_group(uint8_t* entry, const float* v, const CacheLayout& layout,
                                int64_t g, int lane) {
  const int64_t begin = g * 128;
  const int64_t end = begin + 128 < layout.fp8_count ? begin + 128 : layout.fp8_count;
  float mine[4];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = begin + 4 * lane + k;
    mine[k] = i < end ? v[i] : 0.0f;
    amax = fmaxf(amax, fabsf(mine[k]));
  }
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (begin + 4 * lane < end) {
    unsigned packed = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned code = begin + 4 * lane + k < end ? __nv_fp8_e4m3(mine[k] / scale).__x : 0u;
      packed |= code << (8 * k);
    }
    if (begin + 4 * lane + 4 <= end) {
      *reinterpret_cast<unsigned*>(entry + begin + 4 * lane) = packed;
    } else {
      for (int k = 0; begin + 4 * lane + k < end; ++k)
        entry[begin + 4 * lane + k] = static_cast<uint8_t>(packed >> (8 * k));
    }
  }
  if (lane == 0)
    *reinterpret_cast<unsigned*>(entry + layout.fp8_count + 4 * g) = __float_as_uint(scale);
}

// write_fp8_kernel's encoding (the same bytes) with a warp per (token,
// 128-group) instead of a thread: each lane quantises 4 values, the group's
// amax is a warp reduction, the codes go out as one 4-byte store per lane.
// The last warp of a token writes its bf16 tail. A thread looping over its
// group's 128 values twice cost 18-30 us per launch at decode (ncu, glm_1b):
// the KV writes were 11-14% of a decode step.
__global__ void write_fp8_warp_kernel(void* pool, CacheLayout layout, PagedRows rows,
                                      int64_t tokens, const float* values, int64_t stride) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t groups = (layout.fp8_count + 127) / 128;
  const int64_t per_token = groups + 1;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t w = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; w < tokens * per_token;
       w += warps) {
    const int64_t token = w / per_token, g = w % per_token;
    if (rows.positions[token] < 0) continue;  // a padding row writes nothing (uniform per warp)
    uint8_t* entry =
        static_cast<uint8_t*>(pool) + slot_of(rows, token, rows.positions[token]) * layout.bytes();
    const float* v = values + token * stride;
    if (g == groups) {  // the bf16 tail, a value per lane at a time
      uint8_t* tail = entry + layout.fp8_count + 4 * groups;
      store_bf16_tail(tail, v, layout, layout.fp8_count + lane, 32);
      continue;
    }
    store_fp8_group(entry, v, layout, g, lane);
  }
}

// The rotary pairs of one row's `rope` values at x by a block (the rope
// kernel's arithmetic); cos / sin: the row's [rope / 2].
__device__ void rope_row(float* x, int64_t rope, const float* cos, const float* sin,
                         bool interleaved) {
  const int64_t half = rope / 2;
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    float* a = x + (interleaved ? 2 * i : i);
    float* b = x + (interleaved ? 2 * i + 1 : i + half);
    const float x1 = *a, x2 = *b;
    *a = rope_first(x1, x2, cos[i], sin[i]);
    *b = rope_second(x1, x2, cos[i], sin[i]);
  }
}

// Row x (final in global memory for the block) into token t's slot by a
// block, as write_cache_rows encodes it; a padding row writes nothing.
__device__ void write_row(const float* x, void* pool_bytes, const CacheLayout& layout,
                          const PagedRows& rows, int64_t t) {
  if (rows.positions[t] < 0) return;
  uint8_t* pool = static_cast<uint8_t*>(pool_bytes);
  const int64_t slot = slot_of(rows, t, rows.positions[t]);
  if (layout.dtype == CacheDType::FP8) {
    uint8_t* entry = pool + slot * layout.bytes();
    const int64_t groups = (layout.fp8_count + 127) / 128;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t g = warp; g <= groups; g += kThreads / 32) {
      if (g == groups) {
        store_bf16_tail(entry + layout.fp8_count + 4 * groups, x, layout, layout.fp8_count + lane,
                        32);
      } else {
        store_fp8_group(entry, x, layout, g, lane);
      }
    }
  } else if (layout.dtype == CacheDType::BF16) {
    auto* entry = reinterpret_cast<__nv_bfloat16*>(pool) + slot * layout.width;
    for (int64_t i = threadIdx.x; i < layout.width; i += kThreads)
      entry[i] = __float2bfloat16_rn(x[i]);
  } else {
    float* entry = reinterpret_cast<float*>(pool) + slot * layout.width;
    for (int64_t i = threadIdx.x; i < layout.width; i += kThreads) entry[i] = x[i];
  }
}

// norm_rope_write_latent: a block per token row; the operations of rmsnorm,
// rope and write_cache_rows in their order, so the same bits.
__global__ void __launch_bounds__(kThreads) norm_rope_write_kernel(LatentWriteParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ float shared[kThreads / 32];
  const int64_t t = blockIdx.x;
  float* x = p.kv + t * p.stride;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < p.lora; i += kThreads) sum += x[i] * x[i];
  const float inv = rsqrtf(block_sum<kThreads>(sum, shared) / static_cast<float>(p.lora) + p.eps);
  for (int64_t i = threadIdx.x; i < p.lora; i += kThreads) x[i] = p.norm_weight[i] * (x[i] * inv);
  rope_row(x + p.lora, p.rope, p.cos + t * (p.rope / 2), p.sin + t * (p.rope / 2), p.interleaved);
  __syncthreads();  // the row is final in global memory for the whole block
  write_row(x, p.pool, p.layout, p.rows, t);
}

// norm_rope_write_indexer_key: a block per token row; layernorm, rope and
// write_cache_rows in their order (layernorm_row is the layernorm kernel's
// code), so the same bits.
__global__ void __launch_bounds__(kThreads) indexer_key_write_kernel(IndexerKeyWriteParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ float shared[kThreads / 32];
  const int64_t t = blockIdx.x;
  float* x = p.k + t * p.dim;
  layernorm_row<kThreads>(p.k_raw + t * p.dim, p.dim, p.norm_weight, p.norm_bias, p.eps, x, shared);
  __syncthreads();  // the normed row is in global memory for the whole block
  rope_row(x, p.rope, p.cos + t * (p.rope / 2), p.sin + t * (p.rope / 2), p.interleaved);
  __syncthreads();  // the row is final for the whole block
  write_row(x, p.pool, p.layout, p.rows, t);
}

// Blocks (token, chunk of kThreads positions); q[t] staged in shared memory
// ([heads * dim] floats). The chunks spread one token's keys over many SMs
// (a single decode token would otherwise run on one).
__global__ void indexer_scores_kernel(IndexerFallbackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
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
      for (int64_t d = 0; d < p.dim; ++d)
        dot = __fmaf_rn(q[h * p.dim + d], load(p.pool, p.layout, slot, d), dot);
      const float value = __fmul_rn(dot, p.scale);
      if (value > 0.0f) total = __fmaf_rn(w[h], value, total);
    }
    p.scores[t * p.max_context + pos] = total;
  }
}

// 8 bf16 values (one 16-byte load) as fp32, as __bfloat162float converts them.
__device__ __forceinline__ void unpack_bf16x8(uint4 u, float* out) {
  const unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out[2 * k] = __uint_as_float(words[k] << 16);
    out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
  }
}

__device__ __forceinline__ void unpack_float4(float4 f, float* out) {
  out[0] = f.x;
  out[1] = f.y;
  out[2] = f.z;
  out[3] = f.w;
}

// The entry at `slot` as kDim fp32 values in registers, converted as load()
// converts them: 16-byte loads for F32 and BF16 entries (kDim * 2 is a
// multiple of 16), byte loads for the byte-aligned FP8 ones with their
// group scales read once.
template <int kDim>
__device__ __forceinline__ void load_entry(const void* pool, const CacheLayout& layout,
                                           int64_t slot, float (&v)[kDim]) {
  if (layout.dtype == CacheDType::F32) {
    const float4* e =
        reinterpret_cast<const float4*>(static_cast<const float*>(pool) + slot * kDim);
#pragma unroll
    for (int i = 0; i < kDim / 4; ++i) unpack_float4(e[i], v + 4 * i);
  } else if (layout.dtype == CacheDType::BF16) {
    const uint4* e =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(pool) + slot * kDim);
#pragma unroll
    for (int i = 0; i < kDim / 8; ++i) unpack_bf16x8(e[i], v + 8 * i);
  } else {
    const uint8_t* entry = static_cast<const uint8_t*>(pool) + slot * layout.bytes();
    constexpr int kGroups = (kDim + 127) / 128;
    float scales[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      scales[g] = load_scale(entry + kDim + 4 * g);
    }
#pragma unroll
    for (int d = 0; d < kDim; ++d) {
      __nv_fp8_e4m3 code;
      code.__x = entry[d];
      v[d] = static_cast<float>(code) * scales[d / 128];
    }
  }
}

// indexer_scores_kernel's arithmetic (the same operations in the same order,
// so the same bits) with the key read once into registers instead of once per
// head and element: a thread per position, q [heads, kDim] and the head
// weights in shared memory, two heads' dot products in flight at a time.
template <int kDim>
__global__ void __launch_bounds__(kThreads) indexer_scores_entry_kernel(IndexerFallbackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ float shared[];
  float* q = shared;                   // [heads, kDim]
  float* w = shared + p.heads * kDim;  // [heads]
  const int64_t t = blockIdx.x;
  const int64_t visible = p.rows.positions[t] + 1;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x;
  if (first >= visible) return;
  const float4* q4 = reinterpret_cast<const float4*>(p.q + t * p.heads * kDim);
  for (int64_t i = threadIdx.x; i < p.heads * kDim / 4; i += blockDim.x)
    reinterpret_cast<float4*>(q)[i] = q4[i];
  for (int64_t h = threadIdx.x; h < p.heads; h += blockDim.x) w[h] = p.weights[t * p.heads + h];
  __syncthreads();
  const int64_t pos = first + threadIdx.x;
  if (pos >= visible) return;
  float key[kDim];
  load_entry<kDim>(p.pool, p.layout, slot_of(p.rows, t, pos), key);
  float total = 0.0f;
  int64_t h = 0;
  for (; h + 1 < p.heads; h += 2) {
    const float* q0 = q + h * kDim;
    const float* q1 = q0 + kDim;
    float dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll
    for (int d = 0; d < kDim; ++d) {
      dot0 = __fmaf_rn(q0[d], key[d], dot0);
      dot1 = __fmaf_rn(q1[d], key[d], dot1);
    }
    const float value0 = __fmul_rn(dot0, p.scale), value1 = __fmul_rn(dot1, p.scale);
    if (value0 > 0.0f) total = __fmaf_rn(w[h], value0, total);
    if (value1 > 0.0f) total = __fmaf_rn(w[h + 1], value1, total);
  }
  if (h < p.heads) {
    const float* q0 = q + h * kDim;
    float dot = 0.0f;
#pragma unroll
    for (int d = 0; d < kDim; ++d) dot = __fmaf_rn(q0[d], key[d], dot);
    const float value = __fmul_rn(dot, p.scale);
    if (value > 0.0f) total = __fmaf_rn(w[h], value, total);
  }
  p.scores[t * p.max_context + pos] = total;
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
  grid_dependency_wait();
  grid_dependency_trigger();
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
      dot = __fmaf_rn(q_latent[i], c_kv[i], dot);
    }
#pragma unroll
    for (int i = 0; i < kMlaMaxRopePerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < p.rope) dot = __fmaf_rn(q_rope[i], load(p.pool, p.layout, slot, p.kv_lora + d), dot);
    }
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float logit = __fmul_rn(dot, p.scale);
    const float new_max = fmaxf(running_max, logit);
    const float correction = expf(running_max - new_max);
    const float weight = expf(logit - new_max);
    running_sum = __fmaf_rn(running_sum, correction, weight);
#pragma unroll
    for (int i = 0; i < kMlaMaxLatentPerLane; ++i)
      acc[i] = __fmaf_rn(weight, c_kv[i], __fmul_rn(acc[i], correction));
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
    denominator = __fmaf_rn(scales[w], warp_sum[w], denominator);
  }
  float* out = p.out + (t * p.heads + h) * p.kv_lora;
  for (int64_t d = threadIdx.x; d < p.kv_lora; d += kThreads) {
    float value = 0.0f;
    for (int w = 0; w < kMlaWarps; ++w) value = __fmaf_rn(scales[w], warp_acc[w][d], value);
    out[d] = count == 0 ? 0.0f : __fdiv_rn(value, denominator);
  }
}

// Sparse MLA in tiles of selected keys (flash-decoding's structure): a block
// serves kTileHeads heads of one token and walks its selection kTileKeys keys
// at a time. Per tile the block gathers the keys' entries into shared memory
// as fp32 rows (each entry read once for all its heads), then
//   logits:  thread (h, j) computes q_h . entry_j over kv_lora + rope values;
//   softmax: warp h takes the tile's max and exponentials of head h and
//            rescales the running sum (online softmax, as mla_kernel);
//   values:  thread (h, c) accumulates sum_j p_hj entry_j[d] for its dims
//            d = c, c + 64, ... (at most kTileMaxDims of them).
// The work per key is a few shared-memory FMAs instead of mla_kernel's
// shuffle reduction and two exponentials per key and head, on a chain of
// dependent loads per key: on the default model's shapes (8 heads, kv_lora
// 128, top-k 128) mla_kernel and a per-warp version of it sat at 13 cycles per
// issued instruction with 2 warps per scheduler.
// Entries live in shared memory as rows of width + 1 floats: thread (h, j)
// reads row j at the same column as its neighbours, a different bank each.
constexpr int kTileKeys = 64;
constexpr int kTileHeads = kThreads / kTileKeys;  // 4
constexpr int kTileMaxDims = 8;                   // kv_lora <= 64 * 8
static_assert(kTileKeys == 64, "the softmax phase takes two keys per lane");

struct MlaTileShared {
  int64_t row_floats;  // width + 1
  // Byte offsets in the dynamic shared memory.
  int64_t entries, queries, probs, slots, bytes;
};

__host__ __device__ inline MlaTileShared mla_tile_shared(int64_t width) {
  MlaTileShared s;
  s.row_floats = width + 1;
  s.entries = 0;
  s.queries = s.entries + 4 * kTileKeys * s.row_floats;
  s.probs = s.queries + 4 * kTileHeads * width;
  s.slots = s.probs + 4 * kTileHeads * kTileKeys;
  s.bytes = s.slots + 8 * kTileKeys;
  return s;
}

__global__ void __launch_bounds__(kThreads) mla_tile_kernel(MlaFallbackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint4 dynamic_shared[];
  unsigned char* base = reinterpret_cast<unsigned char*>(dynamic_shared);
  const int64_t width = p.kv_lora + p.rope;
  const MlaTileShared layout = mla_tile_shared(width);
  float* entries = reinterpret_cast<float*>(base + layout.entries);  // [kTileKeys, row_floats]
  float* queries = reinterpret_cast<float*>(base + layout.queries);  // [kTileHeads, width]
  float* probs = reinterpret_cast<float*>(base + layout.probs);      // [kTileHeads, kTileKeys]
  int64_t* slots = reinterpret_cast<int64_t*>(base + layout.slots);  // [kTileKeys]
  __shared__ float running_max[kTileHeads], running_sum[kTileHeads], correction[kTileHeads];

  const int64_t groups = (p.heads + kTileHeads - 1) / kTileHeads;
  const int64_t t = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kTileHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* selected = p.indices + t * p.index_stride;
  const int64_t count = p.counts[t];

  // Queries [q_latent | q_rope] of the block's heads (zeros past p.heads).
  for (int64_t i = tid; i < kTileHeads * width; i += kThreads) {
    const int64_t g = i / width, d = i % width, h = h0 + g;
    float value = 0.0f;
    if (h < p.heads) {
      value = d < p.kv_lora
                  ? p.q_latent[(t * p.heads + h) * p.kv_lora + d]
                  : p.q_rope[t * p.rope_row_stride + h * p.rope_head_stride + d - p.kv_lora];
    }
    queries[i] = value;
  }
  if (tid < kTileHeads) {
    running_max[tid] = -FLT_MAX;
    running_sum[tid] = 0.0f;
  }
  // Thread (h, c) of the value phase: dims c + 64 i.
  const int vh = tid / kTileKeys, vc = tid % kTileKeys;
  float acc[kTileMaxDims];
#pragma unroll
  for (int i = 0; i < kTileMaxDims; ++i) acc[i] = 0.0f;

  for (int64_t first = 0; first < count; first += kTileKeys) {
    const int n = static_cast<int>(count - first < kTileKeys ? count - first : kTileKeys);
    __syncthreads();  // the previous tile's readers are done with entries and probs
    if (tid < n) slots[tid] = slot_of(p.rows, t, selected[first + tid]);
    __syncthreads();
    // Gather: 16-byte loads where the layout allows (BF16: 8 values, F32: 4).
    const bool aligned = (reinterpret_cast<uintptr_t>(p.pool) & 15u) == 0;
    if (aligned && p.layout.dtype == CacheDType::BF16 && width % 8 == 0) {
      const int64_t chunks = width / 8;
      for (int64_t i = tid; i < n * chunks; i += kThreads) {
        const int64_t j = i / chunks, c = i % chunks;
        unpack_bf16x8(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.pool) +
                                                     slots[j] * width)[c],
                      entries + j * layout.row_floats + 8 * c);
      }
    } else if (aligned && p.layout.dtype == CacheDType::F32 && width % 4 == 0) {
      const int64_t chunks = width / 4;
      for (int64_t i = tid; i < n * chunks; i += kThreads) {
        const int64_t j = i / chunks, c = i % chunks;
        unpack_float4(reinterpret_cast<const float4*>(static_cast<const float*>(p.pool) +
                                                      slots[j] * width)[c],
                      entries + j * layout.row_floats + 4 * c);
      }
    } else {
      for (int64_t i = tid; i < n * width; i += kThreads) {
        const int64_t j = i / width, d = i % width;
        entries[j * layout.row_floats + d] = load(p.pool, p.layout, slots[j], d);
      }
    }
    __syncthreads();
    {  // logits: thread (h, j)
      const int h = tid / kTileKeys, j = tid % kTileKeys;
      float logit = -FLT_MAX;
      if (j < n) {
        const float* q = queries + h * width;
        const float* e = entries + j * layout.row_floats;
        float dot = 0.0f;
#pragma unroll 8
        for (int64_t d = 0; d < width; ++d) dot = __fmaf_rn(q[d], e[d], dot);
        logit = __fmul_rn(dot, p.scale);
      }
      probs[h * kTileKeys + j] = logit;
    }
    __syncthreads();
    if (warp < kTileHeads) {  // softmax of head `warp` over the tile
      float* row = probs + warp * kTileKeys;
      const float a = row[lane], b = row[lane + 32];
      float most = fmaxf(a, b);
      for (int offset = 16; offset > 0; offset /= 2)
        most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, offset));
      const float old_max = running_max[warp];
      const float new_max = fmaxf(old_max, most);
      const float pa = lane < n ? expf(a - new_max) : 0.0f;
      const float pb = lane + 32 < n ? expf(b - new_max) : 0.0f;
      float sum = pa + pb;
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      row[lane] = pa;
      row[lane + 32] = pb;
      __syncwarp();
      if (lane == 0) {
        const float scale = expf(old_max - new_max);
        correction[warp] = scale;
        running_sum[warp] = __fmaf_rn(running_sum[warp], scale, sum);
        running_max[warp] = new_max;
      }
    }
    __syncthreads();
    {  // values: thread (h, c)
      const float* prob = probs + vh * kTileKeys;
      const float scale = correction[vh];
#pragma unroll
      for (int i = 0; i < kTileMaxDims; ++i) {
        const int64_t d = vc + 64 * i;
        if (d >= p.kv_lora) break;
        float value = __fmul_rn(acc[i], scale);
#pragma unroll 8
        for (int j = 0; j < n; ++j)
          value = __fmaf_rn(prob[j], entries[j * layout.row_floats + d], value);
        acc[i] = value;
      }
    }
  }
  __syncthreads();
  const int64_t h = h0 + vh;
  if (h >= p.heads) return;
  float* out = p.out + (t * p.heads + h) * p.kv_lora;
  const float denominator = running_sum[vh];
#pragma unroll
  for (int i = 0; i < kTileMaxDims; ++i) {
    const int64_t d = vc + 64 * i;
    if (d >= p.kv_lora) break;
    out[d] = count == 0 ? 0.0f : __fdiv_rn(acc[i], denominator);
  }
}

// MEGACTX_CUDA_PLAIN_FALLBACK=1 runs the plain kernels everywhere (to measure
// the fast ones against them in the same build); read once.
bool plain_fallback() {
  static const bool plain = [] {
    const char* value = std::getenv("MEGACTX_CUDA_PLAIN_FALLBACK");
    return value != nullptr && value[0] == '1';
  }();
  return plain;
}

int blocks_for(int64_t count) { return grid_stride_blocks(count, kThreads); }

}  // namespace

void write_cache_rows(void* pool, const CacheLayout& layout, const PagedRows& rows, int64_t tokens,
                      const float* values, int64_t stride, cudaStream_t stream) {
  if (tokens == 0) return;
  if (layout.dtype == CacheDType::FP8) {
    const int64_t per_token = (layout.fp8_count + 127) / 128 + 1;
    // The warp kernel stores codes and scales 4 bytes at a time: every entry
    // (and so every code group and scale) must start 4-byte aligned.
    const bool aligned = layout.bytes() % 4 == 0 && layout.fp8_count % 4 == 0 &&
                         (reinterpret_cast<uintptr_t>(pool) & 3u) == 0;
    if (aligned && !plain_fallback()) {
      launch_kernel(write_fp8_warp_kernel, blocks_for(tokens * per_token * 32), kThreads, 0, stream,
                    pool, layout, rows, tokens, values, stride);
    } else {
      launch_kernel(write_fp8_kernel, blocks_for(tokens * per_token), kThreads, 0, stream, pool,
                    layout, rows, tokens, values, stride);
    }
  } else {
    launch_kernel(write_plain_kernel, blocks_for(tokens * layout.width), kThreads, 0, stream, pool,
                  layout, rows, tokens, values, stride);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

namespace {

// Launches the entry-in-registers scorer for kDim; false when the shape or
// the alignment of q does not suit it.
template <int kDim>
bool launch_entry_scores(const IndexerFallbackParams& p, const dim3& grid, cudaStream_t stream) {
  if (p.dim != kDim || (reinterpret_cast<uintptr_t>(p.q) & 15u) != 0) return false;
  if (p.layout.dtype != CacheDType::FP8 && (reinterpret_cast<uintptr_t>(p.pool) & 15u) != 0)
    return false;
  const size_t shared = static_cast<size_t>(p.heads * (kDim + 1)) * sizeof(float);
  if (shared > 48 * 1024) return false;
  launch_kernel(indexer_scores_entry_kernel<kDim>, grid, kThreads, shared, stream, p);
  return true;
}

void indexer_scores(const IndexerFallbackParams& p, bool plain, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.max_context + kThreads - 1) / kThreads));
  if (plain ||
      !(launch_entry_scores<16>(p, grid, stream) || launch_entry_scores<32>(p, grid, stream) ||
        launch_entry_scores<64>(p, grid, stream) || launch_entry_scores<128>(p, grid, stream))) {
    const size_t q_bytes = static_cast<size_t>(p.heads * p.dim) * sizeof(float);
    launch_kernel(indexer_scores_kernel, grid, kThreads, q_bytes, stream, p);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

// The tile kernel, when its shared memory fits the device and kv_lora its
// per-thread dims; false otherwise (the plain kernel runs).
bool launch_tile_mla(const MlaFallbackParams& p, cudaStream_t stream) {
  if (p.kv_lora > 64 * kTileMaxDims) return false;
  const int64_t bytes = mla_tile_shared(p.kv_lora + p.rope).bytes;
  // Once: the opt-in above 48 KiB, up to the device's per-block limit less the
  // kernel's static shared memory (0 if the opt-in fails: the plain kernel runs).
  static const int64_t limit = [] {
    int device = 0, most = 0;
    cudaFuncAttributes attributes{};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess ||
        cudaFuncGetAttributes(&attributes, mla_tile_kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return int64_t{0};
    }
    const int dynamic = most - static_cast<int>(attributes.sharedSizeBytes);
    if (cudaFuncSetAttribute(mla_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             dynamic) != cudaSuccess) {
      (void)cudaGetLastError();
      return int64_t{0};
    }
    return static_cast<int64_t>(dynamic);
  }();
  if (bytes > limit) return false;
  const int64_t groups = (p.heads + kTileHeads - 1) / kTileHeads;
  launch_kernel(mla_tile_kernel, static_cast<unsigned>(p.tokens * groups), kThreads,
                static_cast<size_t>(bytes), stream, p);
  return true;
}

}  // namespace

namespace {

// The fused writers store FP8 entries a 4-byte word at a time: entries,
// their e4m3 part and the pool must be word aligned (else the
// thread-per-group writer of the separate launches).
bool word_writes_fit(const CacheLayout& layout, const void* pool) {
  return layout.dtype != CacheDType::FP8 || (layout.bytes() % 4 == 0 && layout.fp8_count % 4 == 0 &&
                                             (reinterpret_cast<uintptr_t>(pool) & 3u) == 0);
}

}  // namespace

bool fused_latent_write() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_FUSED_LATENT_WRITE");
    return kFusedLatentWrite && !(value != nullptr && value[0] == '0');
  }();
  return on;
}

void norm_rope_write_latent(const LatentWriteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  if (!word_writes_fit(p.layout, p.pool)) {
    // The thread-per-group writer: the same three steps as separate launches.
    detail::norm_rope_write_latent_separately(p, stream);
    return;
  }
  launch_kernel(norm_rope_write_kernel, static_cast<unsigned>(p.tokens), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void norm_rope_write_indexer_key(const IndexerKeyWriteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  if (!word_writes_fit(p.layout, p.pool)) {
    // The thread-per-group writer: the same three steps as separate launches.
    detail::norm_rope_write_indexer_key_separately(p, stream);
    return;
  }
  launch_kernel(indexer_key_write_kernel, static_cast<unsigned>(p.tokens), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void indexer_topk_fallback(const IndexerFallbackParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  indexer_scores(p, plain_fallback(), stream);
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
  if (plain_fallback() || !launch_tile_mla(p, stream)) {
    launch_kernel(mla_kernel, static_cast<unsigned>(p.tokens * p.heads), kThreads, 0, stream, p);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

namespace detail {

void norm_rope_write_latent_separately(const LatentWriteParams& p, cudaStream_t stream) {
  rmsnorm(p.kv, p.tokens, p.lora, p.stride, p.norm_weight, p.eps, p.kv, p.stride, stream);
  rope(p.kv + p.lora, p.tokens, 1, p.stride, 0, p.rope, p.cos, p.sin, p.interleaved, stream);
  write_cache_rows(p.pool, p.layout, p.rows, p.tokens, p.kv, p.stride, stream);
}

void norm_rope_write_indexer_key_separately(const IndexerKeyWriteParams& p, cudaStream_t stream) {
  layernorm(p.k_raw, p.tokens, p.dim, p.norm_weight, p.norm_bias, p.eps, p.k, stream);
  rope(p.k, p.tokens, 1, p.dim, 0, p.rope, p.cos, p.sin, p.interleaved, stream);
  write_cache_rows(p.pool, p.layout, p.rows, p.tokens, p.k, p.dim, stream);
}

void indexer_scores_fallback(const IndexerFallbackParams& p, bool plain, cudaStream_t stream) {
  if (p.tokens > 0) indexer_scores(p, plain, stream);
}

void mla_attention_fallback_plain(const MlaFallbackParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  launch_kernel(mla_kernel, static_cast<unsigned>(p.tokens * p.heads), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
