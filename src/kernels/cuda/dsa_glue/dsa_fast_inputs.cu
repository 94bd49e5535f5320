// Element-wise glue kernels of the fast DSA path (see dsa_fast_inputs.h):
// one grid-stride loop each over the output elements.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/row_launch.cuh"
#include "kernels/cuda/common/row_ops.cuh"
#include "kernels/cuda/dsa_glue/dsa_fast_inputs.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

unsigned blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
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

// The kernels below run on row_launch (common/row_launch.cuh): a token per grid
// row, its elements along x, at most an int32 division per element.
__global__ void pad_indexer_queries_kernel(IndexerQueryPadParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t dim = static_cast<int32_t>(p.dim);
  for (ROW_LAUNCH_ROWS(t, p.tokens)) {
    for (ROW_LAUNCH_COLUMNS(j, p.padded_heads * p.dim)) {
      const int32_t h = static_cast<int32_t>(j) / dim, d = static_cast<int32_t>(j) - h * dim;
      const bool real = h < p.heads;
      p.q_bf16[t * p.padded_heads * p.dim + j] =
          real ? float_to_bf16_bits(p.q[(t * p.heads + h) * p.dim + d]) : uint16_t{0};
      if (d == 0)
        p.weights_padded[t * p.padded_heads + h] = real ? p.weights[t * p.heads + h] : 0.f;
    }
  }
}

__global__ void positions_to_slots_kernel(PositionsToSlotsParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t page_size = static_cast<int32_t>(p.rows.page_size);
  for (ROW_LAUNCH_ROWS(t, p.tokens)) {
    const int32_t* table = p.rows.page_tables + p.rows.table_offset[t];
    const int64_t count = p.counts[t], last = p.rows.positions[t];
    for (ROW_LAUNCH_COLUMNS(k, p.top_k)) {
      const int32_t position = p.selected[t * p.selected_stride + k];
      int32_t slot = -1;
      if (k < count && position >= 0 && position <= last)
        slot = table[position / page_size] * page_size + position % page_size;
      p.slots[t * p.top_k + k] = slot;
    }
  }
}

// Columns along x: the real heads' rope columns, then (with q_latent) their
// latent columns, then the padded heads' zeros: with kVectorZeros in
// 16-byte units (their columns are contiguous; glm_1b's 48 padded heads of
// 576 took 14.6 us per layer at 64 rows as 2-byte stores), else one column
// each; a null q_latent leaves the latent columns (the bf16 product wrote
// them) untouched.
constexpr int64_t kZeroUnit = 8;  // bf16 per 16-byte store

// Whether the padded heads' zeros can go in 16-byte stores: whole units per
// row, from a 16-byte aligned q (the sparse MLA requires that too).
bool vector_zeros(const MlaQueryPackParams& p) {
  return (p.lora + p.rope) % kZeroUnit == 0 && reinterpret_cast<uintptr_t>(p.q) % 16 == 0;
}

__host__ __device__ int64_t pack_columns(const MlaQueryPackParams& p, bool vector) {
  return p.heads * p.rope + (p.q_latent != nullptr ? p.heads * p.lora : 0) +
         (p.padded_heads - p.heads) * (p.lora + p.rope) / (vector ? kZeroUnit : 1);
}

template <bool kVectorZeros>
__global__ void pack_mla_queries_kernel(MlaQueryPackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t lora = static_cast<int32_t>(p.lora), rope = static_cast<int32_t>(p.rope);
  const int32_t width = lora + rope, heads = static_cast<int32_t>(p.heads);
  const int64_t rope_part = p.heads * p.rope;
  const int64_t latent_part = p.q_latent != nullptr ? p.heads * p.lora : 0;
  const int64_t columns = pack_columns(p, kVectorZeros);
  for (ROW_LAUNCH_ROWS(t, p.tokens)) {
    uint16_t* out = p.q + t * p.padded_heads * width;
    for (ROW_LAUNCH_COLUMNS(j, columns)) {
      if (j < rope_part) {
        const int32_t h = static_cast<int32_t>(j) / rope, c = static_cast<int32_t>(j) - h * rope;
        const int64_t at = t * p.rope_row_stride + h * p.rope_head_stride;
        float value;
        if (p.q_rope_bf16 == nullptr) {
          value = p.q_rope[at + c];
        } else {
          // Column c is the first or second of its rotated pair (i, partner).
          const int32_t half = rope / 2;
          const bool first = p.interleaved ? (c & 1) == 0 : c < half;
          const int32_t i = p.interleaved ? c / 2 : (first ? c : c - half);
          const int32_t a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + half;
          const float x1 = bf16_bits_to_float(p.q_rope_bf16[at + a]);
          const float x2 = bf16_bits_to_float(p.q_rope_bf16[at + b]);
          const float cs = p.cos[t * half + i], sn = p.sin[t * half + i];
          value = first ? rope_first(x1, x2, cs, sn) : rope_second(x1, x2, cs, sn);
        }
        out[h * width + lora + c] = float_to_bf16_bits(value);
      } else if (j < rope_part + latent_part) {
        const int32_t i = static_cast<int32_t>(j - rope_part);
        const int32_t h = i / lora, c = i - h * lora;
        out[h * width + c] = float_to_bf16_bits(p.q_latent[(t * p.heads + h) * p.lora + c]);
      } else if constexpr (kVectorZeros) {
        reinterpret_cast<uint4*>(out + heads * width)[j - rope_part - latent_part] =
            make_uint4(0, 0, 0, 0);
      } else {
        out[heads * width + (j - rope_part - latent_part)] = 0;
      }
    }
  }
}

__global__ void unpack_mla_output_kernel(MlaOutputUnpackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t lora = static_cast<int32_t>(p.lora);
  for (ROW_LAUNCH_ROWS(t, p.tokens)) {
    for (ROW_LAUNCH_COLUMNS(j, p.heads * p.lora)) {
      const int32_t h = static_cast<int32_t>(j) / lora, c = static_cast<int32_t>(j) - h * lora;
      p.out[t * p.heads * p.lora + j] =
          bf16_bits_to_float(p.attention[(t * p.padded_heads + h) * p.lora + c]);
    }
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
  if (p.tokens * p.padded_heads * p.dim == 0) return;
  const RowLaunch shape = row_launch(p.tokens, p.padded_heads * p.dim);
  launch_kernel(pad_indexer_queries_kernel, shape.grid, shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void positions_to_slots(const PositionsToSlotsParams& p, cudaStream_t stream) {
  if (p.tokens * p.top_k == 0) return;
  const RowLaunch shape = row_launch(p.tokens, p.top_k);
  launch_kernel(positions_to_slots_kernel, shape.grid, shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void pack_mla_queries(const MlaQueryPackParams& p, cudaStream_t stream) {
  if (p.tokens * p.padded_heads == 0) return;
  const bool vector = vector_zeros(p);
  // The columns one token's thread row covers (pack_mla_queries_kernel).
  const RowLaunch shape = row_launch(p.tokens, pack_columns(p, vector));
  launch_kernel(vector ? pack_mla_queries_kernel<true> : pack_mla_queries_kernel<false>,
                shape.grid, shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void unpack_mla_output(const MlaOutputUnpackParams& p, cudaStream_t stream) {
  if (p.tokens * p.heads * p.lora == 0) return;
  const RowLaunch shape = row_launch(p.tokens, p.heads * p.lora);
  launch_kernel(unpack_mla_output_kernel, shape.grid, shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
