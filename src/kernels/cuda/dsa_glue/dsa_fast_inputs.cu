// Element-wise glue kernels of the fast DSA path (see dsa_fast_inputs.h):
// one grid-stride loop each over the output elements.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/dsa_glue/dsa_fast_inputs.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

unsigned blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// bf16 bits of x, round to nearest even, with integer arithmetic only (CUDA
// 13.0 mis-stored the low byte of a __nv_bfloat16: docs/benchmarks.md).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void build_token_tables_kernel(TokenTablesParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t total = p.tokens * p.table_stride;
  const int64_t page_size = p.rows.page_size;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    const int64_t t = i / p.table_stride, j = i % p.table_stride;
    const int64_t position = p.rows.positions[t];
    const int64_t pages = (position + page_size) / page_size;  // ceil((position + 1) / page_size)
    p.tables[i] = j < pages ? p.rows.page_tables[p.rows.table_offset[t] + j] : -1;
    if (j == 0) {
      p.visible[t] = static_cast<int32_t>(position + 1);
      p.row_ids[t] = static_cast<int32_t>(t);
      p.counts[t] = static_cast<int32_t>(position + 1 < p.top_k ? position + 1 : p.top_k);
    }
  }
}

__global__ void pad_indexer_queries_kernel(IndexerQueryPadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t total = p.tokens * p.padded_heads * p.dim;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    const int64_t d = i % p.dim;
    const int64_t head_row = i / p.dim;  // t * padded_heads + h
    const int64_t h = head_row % p.padded_heads, t = head_row / p.padded_heads;
    const bool real = h < p.heads;
    p.q_bf16[i] = real ? float_to_bf16_bits(p.q[(t * p.heads + h) * p.dim + d]) : uint16_t{0};
    if (d == 0) p.weights_padded[head_row] = real ? p.weights[t * p.heads + h] : 0.f;
  }
}

__global__ void positions_to_slots_kernel(PositionsToSlotsParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t total = p.tokens * p.top_k;
  const int64_t page_size = p.rows.page_size;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    const int64_t t = i / p.top_k, k = i % p.top_k;
    const int64_t position = p.selected[t * p.selected_stride + k];
    int32_t slot = -1;
    if (k < p.counts[t] && position >= 0 && position <= p.rows.positions[t]) {
      const int32_t* table = p.rows.page_tables + p.rows.table_offset[t];
      slot = static_cast<int32_t>(table[position / page_size] * page_size + position % page_size);
    }
    p.slots[i] = slot;
  }
}

__global__ void pack_mla_queries_kernel(MlaQueryPackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t width = p.lora + p.rope;
  const int64_t total = p.tokens * p.padded_heads * width;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    const int64_t c = i % width;
    const int64_t head_row = i / width;
    const int64_t h = head_row % p.padded_heads, t = head_row / p.padded_heads;
    if (p.q_latent == nullptr && h < p.heads && c < p.lora) continue;  // written in bf16 already
    float value = 0.f;
    if (h < p.heads)
      value = c < p.lora ? p.q_latent[(t * p.heads + h) * p.lora + c]
                         : p.q_rope[t * p.rope_row_stride + h * p.rope_head_stride + (c - p.lora)];
    p.q[i] = float_to_bf16_bits(value);
  }
}

__global__ void unpack_mla_output_kernel(MlaOutputUnpackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t total = p.tokens * p.heads * p.lora;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    const int64_t c = i % p.lora;
    const int64_t head_row = i / p.lora;
    const int64_t h = head_row % p.heads, t = head_row / p.heads;
    p.out[i] = bf16_bits_to_float(p.attention[(t * p.padded_heads + h) * p.lora + c]);
  }
}

}  // namespace

void build_token_tables(const TokenTablesParams& p, cudaStream_t stream) {
  const int64_t total = p.tokens * p.table_stride;
  if (total == 0) return;
  launch_kernel(build_token_tables_kernel, blocks_for(total), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void pad_indexer_queries(const IndexerQueryPadParams& p, cudaStream_t stream) {
  const int64_t total = p.tokens * p.padded_heads * p.dim;
  if (total == 0) return;
  launch_kernel(pad_indexer_queries_kernel, blocks_for(total), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void positions_to_slots(const PositionsToSlotsParams& p, cudaStream_t stream) {
  const int64_t total = p.tokens * p.top_k;
  if (total == 0) return;
  launch_kernel(positions_to_slots_kernel, blocks_for(total), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void pack_mla_queries(const MlaQueryPackParams& p, cudaStream_t stream) {
  const int64_t total = p.tokens * p.padded_heads * (p.lora + p.rope);
  if (total == 0) return;
  launch_kernel(pack_mla_queries_kernel, blocks_for(total), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void unpack_mla_output(const MlaOutputUnpackParams& p, cudaStream_t stream) {
  const int64_t total = p.tokens * p.heads * p.lora;
  if (total == 0) return;
  launch_kernel(unpack_mla_output_kernel, blocks_for(total), kThreads, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
