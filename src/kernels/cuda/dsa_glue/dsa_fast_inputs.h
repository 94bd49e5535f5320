// Glue between the CUDA model's fp32 tensors and the fp8 DSA kernels
// (kernels/cuda/{indexer,topk,sparse_mla}): per-token block tables, bf16
// queries padded to the head counts those kernels support, selected positions
// mapped to physical cache slots, and the bf16 attention output back to fp32.
//
// Paging as dsa_fallback.h (PagedRows): token t's sequence has its page table
// at page_tables + table_offset[t]; position p lives at
// slot = table[p / page_size] * page_size + p % page_size.
// Every function launches on `stream` with no host synchronisation and no
// allocation (CUDA-graph capturable); shapes are trusted (the model checked them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dsa_fallback/dsa_fallback.h"

namespace megactx::cuda {

// Per token t at position p_t, what the indexer and radix top-k read:
//   tables[t, j] = page_tables[table_offset[t] + j]  for j < ceil((p_t + 1) / page_size),
//                  -1 for the rest of the row (never read);
//   visible[t]   = p_t + 1 (causal), row_ids[t] = t (each token its own "request"),
//   counts[t]    = min(top_k, p_t + 1) (how many positions the selection holds).
struct TokenTablesParams {
  PagedRows rows;
  int64_t tokens = 0;
  int64_t table_stride = 0;  // >= ceil(max position + 1 / page_size)
  int64_t top_k = 0;
  int32_t* tables = nullptr;   // [tokens, table_stride] out
  int32_t* visible = nullptr;  // [tokens] out
  int32_t* row_ids = nullptr;  // [tokens] out
  int32_t* counts = nullptr;   // [tokens] out
};
void build_token_tables(const TokenTablesParams& p, cudaStream_t stream);

// q_bf16[t, h, :] = bf16(q[t, h, :]) and weights_padded[t, h] = weights[t, h]
// for h < heads; zero for heads <= h < padded_heads (a zero query with a zero
// weight adds relu(0) * 0 to every score). The model no longer runs it:
// quantize_indexer_queries' float32 form (indexer/indexer.h) pads and
// quantises in one launch; this is what the tests hold that form to.
struct IndexerQueryPadParams {
  const float* q = nullptr;        // [tokens, heads, dim]
  const float* weights = nullptr;  // [tokens, heads]
  int64_t tokens = 0, heads = 0, padded_heads = 0, dim = 0;
  uint16_t* q_bf16 = nullptr;       // [tokens, padded_heads, dim] out
  float* weights_padded = nullptr;  // [tokens, padded_heads] out
};
void pad_indexer_queries(const IndexerQueryPadParams& p, cudaStream_t stream);

// slots[t, i] = the slot of position selected[t, i] in token t's sequence for
// i < counts[t] when 0 <= position <= positions[t]; -1 otherwise (padding, or
// anything a caller-supplied selection holds outside the causal window).
// top_k may be narrower than the selection's row stride: every count is at
// most min(index_topk, longest context), so the columns past that are -1 and
// sparse MLA need not walk them.
struct PositionsToSlotsParams {
  const int32_t* selected = nullptr;  // [tokens, selected_stride] positions
  const int32_t* counts = nullptr;    // [tokens]
  PagedRows rows;
  int64_t tokens = 0, selected_stride = 0, top_k = 0;  // top_k <= selected_stride
  int32_t* slots = nullptr;                            // [tokens, top_k] out
};
void positions_to_slots(const PositionsToSlotsParams& p, cudaStream_t stream);

// q[t, h, :] = bf16([q_latent[t, h, 0:lora] | q_rope[t, h, 0:rope]]) for h < heads,
// zero rows for heads <= h < padded_heads. A null q_latent leaves q[t, h,
// 0:lora] of h < heads as they are (a bf16 product wrote them there).
// The rope columns come rotated in float32 (q_rope), or unrotated in bf16
// (q_rope_bf16, the bf16 q_b output of the bf16 absorbed products): then the
// pack rotates them with cos / sin [tokens, rope / 2] (rope() of
// elementwise_ops.h, in float32 on the bf16 values) before rounding.
struct MlaQueryPackParams {
  const float* q_latent = nullptr;  // [tokens, heads, lora] or null
  // Token t head h at q_rope + t*rope_row_stride + h*rope_head_stride (either).
  const float* q_rope = nullptr;
  const uint16_t* q_rope_bf16 = nullptr;
  const float *cos = nullptr, *sin = nullptr;  // q_rope_bf16's rotation
  bool interleaved = false;                    // pairs (2i, 2i+1), else (i, i + rope/2)
  int64_t rope_row_stride = 0, rope_head_stride = 0;
  int64_t tokens = 0, heads = 0, padded_heads = 0, lora = 0, rope = 0;
  uint16_t* q = nullptr;  // [tokens, padded_heads, lora + rope] out
};
void pack_mla_queries(const MlaQueryPackParams& p, cudaStream_t stream);

// out[t, h, :] = float(attention[t, h, :]) for h < heads (padded heads dropped).
struct MlaOutputUnpackParams {
  const uint16_t* attention = nullptr;  // [tokens, padded_heads, lora] bf16
  int64_t tokens = 0, heads = 0, padded_heads = 0, lora = 0;
  float* out = nullptr;  // [tokens, heads, lora] out
};
void unpack_mla_output(const MlaOutputUnpackParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
