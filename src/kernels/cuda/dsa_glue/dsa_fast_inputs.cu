// Element-wise glue kernels of the fast DSA path (see dsa_fast_inputs.h):
// one grid-stride loop each over the output elements.
#include <cstdlib>

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

// MEGACTX_CUDA_GLUE_VECTORS=0: the one-column kernels of positions_to_slots
// and the bf16 query pack everywhere (A/B runs; read once).
bool glue_vectors() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_CUDA_GLUE_VECTORS");
    return !(value != nullptr && value[0] == '0');
  }();
  return on;
}

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

// The pool slot of selected entry k (position `position`) of a row whose page
// table is `table`: -1 past the row's count or outside [0, last].
__device__ __forceinline__ int32_t selected_slot(const int32_t* table, int32_t page_size, int64_t k,
                                                 int64_t count, int32_t position, int64_t last) {
  if (k >= count || position < 0 || position > last) return -1;
  return table[position / page_size] * page_size + position % page_size;
}

// kWidth columns per thread: 1, or 4 with int4 loads and stores (rows of
// whole 16-byte units). One column per thread is latency-bound at a prefill
// chunk's sizes (a dependent page-table load per 4-byte column: 22 us per
// 1024-row block of 2048 columns on an H100, ncu; four: 9.6 us).
template <int kWidth>
__global__ void positions_to_slots_kernel(PositionsToSlotsParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t page_size = static_cast<int32_t>(p.rows.page_size);
  for (ROW_LAUNCH_ROWS(t, p.tokens)) {
    const int32_t* table = p.rows.page_tables + p.rows.table_offset[t];
    const int64_t count = p.counts[t], last = p.rows.positions[t];
    const int32_t* selected = p.selected + t * p.selected_stride;
    int32_t* slots = p.slots + t * p.top_k;
    for (ROW_LAUNCH_COLUMNS(u, p.top_k / kWidth)) {
      if constexpr (kWidth == 4) {
        const int4 at = reinterpret_cast<const int4*>(selected)[u];
        const int32_t position[4] = {at.x, at.y, at.z, at.w};
        int32_t slot[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          slot[e] = selected_slot(table, page_size, 4 * u + e, count, position[e], last);
        reinterpret_cast<int4*>(slots)[u] = make_int4(slot[0], slot[1], slot[2], slot[3]);
      } else {
        slots[u] = selected_slot(table, page_size, u, count, selected[u], last);
      }
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

// The bf16 absorbed products' pack (q_latent null, unrotated bf16 rope
// columns): a thread per 4 rotated pairs of a head (8-byte loads of each
// half, or one 16-byte load of 4 interleaved pairs; 16-byte cos / sin), then
// the padded heads' zeros in 16-byte units. The same arithmetic as the
// one-column kernel (same bits); that one, a thread per 2-byte column, took
// 43 us per 1024-row block of GLM-5.2's 64 heads on an H100 (ncu).
constexpr int kRopePairsPerThread = 4;

// The units one token's thread row covers: 4-pair rope units of the real
// heads, then the padded heads' 16-byte zero units.
__host__ __device__ int64_t rope_pack_units(const MlaQueryPackParams& p) {
  return p.heads * (p.rope / 2 / kRopePairsPerThread) +
         (p.padded_heads - p.heads) * (p.lora + p.rope) / kZeroUnit;
}

__global__ void pack_mla_rope_bf16_kernel(MlaQueryPackParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t lora = static_cast<int32_t>(p.lora), rope = static_cast<int32_t>(p.rope);
  const int32_t width = lora + rope, heads = static_cast<int32_t>(p.heads);
  const int32_t half = rope / 2, units_per_head = half / kRopePairsPerThread;
  const int64_t rope_units = p.heads * units_per_head;
  const int64_t columns = rope_pack_units(p);
  for (ROW_LAUNCH_ROWS(t, p.tokens)) {
    uint16_t* out = p.q + t * p.padded_heads * width;
    for (ROW_LAUNCH_COLUMNS(j, columns)) {
      if (j >= rope_units) {
        reinterpret_cast<uint4*>(out + heads * width)[j - rope_units] = make_uint4(0, 0, 0, 0);
        continue;
      }
      const int32_t h = static_cast<int32_t>(j) / units_per_head;
      const int32_t i0 = (static_cast<int32_t>(j) - h * units_per_head) * kRopePairsPerThread;
      const uint16_t* head = p.q_rope_bf16 + t * p.rope_row_stride + h * p.rope_head_stride;
      const float4 cs = *reinterpret_cast<const float4*>(p.cos + t * half + i0);
      const float4 sn = *reinterpret_cast<const float4*>(p.sin + t * half + i0);
      const float c[4] = {cs.x, cs.y, cs.z, cs.w}, s[4] = {sn.x, sn.y, sn.z, sn.w};
      uint16_t* row = out + h * width + lora;
      if (p.interleaved) {  // pairs (2i, 2i + 1): 8 adjacent values
        const uint4 v = *reinterpret_cast<const uint4*>(head + 2 * i0);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        uint32_t rotated[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x1 = bf16_bits_to_float(static_cast<uint16_t>(words[e] & 0xffffu));
          const float x2 = bf16_bits_to_float(static_cast<uint16_t>(words[e] >> 16));
          rotated[e] = static_cast<uint32_t>(float_to_bf16_bits(rope_first(x1, x2, c[e], s[e]))) |
                       static_cast<uint32_t>(float_to_bf16_bits(rope_second(x1, x2, c[e], s[e])))
                           << 16;
        }
        *reinterpret_cast<uint4*>(row + 2 * i0) =
            make_uint4(rotated[0], rotated[1], rotated[2], rotated[3]);
      } else {  // pairs (i, i + rope / 2): 4 values of each half
        const uint2 a = *reinterpret_cast<const uint2*>(head + i0);
        const uint2 b = *reinterpret_cast<const uint2*>(head + half + i0);
        const uint32_t first_words[2] = {a.x, a.y}, second_words[2] = {b.x, b.y};
        uint32_t first[2] = {0, 0}, second[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int shift = 16 * (e % 2);
          const float x1 = bf16_bits_to_float(static_cast<uint16_t>(first_words[e / 2] >> shift));
          const float x2 = bf16_bits_to_float(static_cast<uint16_t>(second_words[e / 2] >> shift));
          first[e / 2] |= static_cast<uint32_t>(float_to_bf16_bits(rope_first(x1, x2, c[e], s[e])))
                          << shift;
          second[e / 2] |=
              static_cast<uint32_t>(float_to_bf16_bits(rope_second(x1, x2, c[e], s[e]))) << shift;
        }
        *reinterpret_cast<uint2*>(row + i0) = make_uint2(first[0], first[1]);
        *reinterpret_cast<uint2*>(row + half + i0) = make_uint2(second[0], second[1]);
      }
    }
  }
}

// Whether pack_mla_rope_bf16_kernel can take p: the bf16 rope path without
// q_latent, whole 4-pair units, and every vector access aligned (16 bytes
// for the interleaved loads, 8 for the halves, 16 for cos / sin and q; a
// rope of whole 4-pair units and vector_zeros' whole rows make lora a
// multiple of 8, so the rope columns' stores are aligned too).
bool rope_bf16_vectors(const MlaQueryPackParams& p) {
  const int64_t half = p.rope / 2;
  const int64_t load_elements = p.interleaved ? 8 : 4;  // bf16 per aligned load
  auto aligned = [](const void* x, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(x) % bytes == 0;
  };
  return p.q_latent == nullptr && p.q_rope_bf16 != nullptr && p.rope % 2 == 0 &&
         half % kRopePairsPerThread == 0 && vector_zeros(p) &&
         aligned(p.q_rope_bf16, 2 * load_elements) && p.rope_row_stride % load_elements == 0 &&
         p.rope_head_stride % load_elements == 0 && aligned(p.cos, 16) && aligned(p.sin, 16);
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
  const bool x4 = glue_vectors() && p.top_k % 4 == 0 && p.selected_stride % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(p.selected) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(p.slots) % 16 == 0;
  if (x4) {
    const RowLaunch shape = row_launch(p.tokens, p.top_k / 4);
    launch_kernel(positions_to_slots_kernel<4>, shape.grid, shape.block, 0, stream, p);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const RowLaunch shape = row_launch(p.tokens, p.top_k);
  launch_kernel(positions_to_slots_kernel<1>, shape.grid, shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void pack_mla_queries(const MlaQueryPackParams& p, cudaStream_t stream) {
  if (p.tokens * p.padded_heads == 0) return;
  if (glue_vectors() && rope_bf16_vectors(p)) {
    const RowLaunch shape = row_launch(p.tokens, rope_pack_units(p));
    launch_kernel(pack_mla_rope_bf16_kernel, shape.grid, shape.block, 0, stream, p);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const bool vector = vector_zeros(p);
  // The columns one token's thread row covers (pack_mla_queries_kernel).
  const RowLaunch shape = row_launch(p.tokens, pack_columns(p, vector));
  launch_kernel(vector ? pack_mla_queries_kernel<true> : pack_mla_queries_kernel<false>, shape.grid,
                shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void unpack_mla_output(const MlaOutputUnpackParams& p, cudaStream_t stream) {
  if (p.tokens * p.heads * p.lora == 0) return;
  const RowLaunch shape = row_launch(p.tokens, p.heads * p.lora);
  launch_kernel(unpack_mla_output_kernel, shape.grid, shape.block, 0, stream, p);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
