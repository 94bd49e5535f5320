// Lightning indexer on the GPU: scores every cached key of a request against
// the indexer queries of each query row, from the paged fp8 key cache
// (132 B per token: 128 e4m3 | fp32 scale), on tensor cores (mma e4m3).
//
//   score(row, p) = key_scale(p) * sum_h weight(row, h) * relu(q8(row, h) . k8(p))
//
// which equals the model's sum_h w(h) * relu(q(h) . k(p) * D^-0.5) once the
// query quantisation scale and D^-0.5 are folded into `weight` (ReLU commutes
// with positive scales): quantize_indexer_queries() does that fold.
//
// Rows come in groups of `rows_per_group` (1..8) consecutive rows of one
// request: the decode rows of one request (MTP verification: 1..8 tokens) or
// 8 consecutive prefill tokens. A group reads each key page once.
// Causality is per row: row r sees key positions [0, row_visible[r]).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {

struct IndexerScoreParams {
  const uint8_t* queries = nullptr;      // [rows, heads, 128] e4m3
  const float* weights = nullptr;        // [rows, heads] head weight * query scale * D^-0.5
  const uint8_t* key_pool = nullptr;     // [num_pages * 64, 132] indexer cache of this layer
  const int32_t* block_table = nullptr;  // [num_requests, block_table_stride] physical page ids
  const int32_t* row_request = nullptr;  // [rows] request of each row (same within a group)
  const int32_t* row_visible = nullptr;  // [rows] keys visible to each row (causal length)
  float* scores = nullptr;               // [rows, score_stride] out: fp32 scores, p < row_visible
  int64_t score_stride = 0;
  int rows = 0;
  int heads = 0;           // 32 (GLM-5.x) or 64 (DeepSeek-V3.2)
  int rows_per_group = 1;  // 1..8; rows % rows_per_group == 0
  int block_table_stride = 0;
  int max_visible = 0;  // >= every row_visible; sizes the grid (up to 1,048,576 and beyond)
  // How pages reach shared memory: TMA bulk copies (one request per 8448-byte
  // page) or cp.async (one per 16 bytes). Both are tested; the benchmark times both.
  bool bulk_copies = true;
};

// Quantises bf16 indexer queries to e4m3 per (row, head) (scale = amax / 448)
// and folds that scale and `softmax_scale` into the head weights.
struct QuantizeIndexerParams {
  const uint16_t* queries = nullptr;    // [rows, heads, 128] bf16 (after RoPE)
  const float* head_weights = nullptr;  // [rows, heads] weights_proj(h) * heads^-0.5
  // Or, with queries and head_weights null, straight from the model's float32
  // queries [rows, source_heads, 128] and weights [rows, source_heads]
  // (source_heads <= heads; the padded heads quantise as zeros with weight 0),
  // each value rounded to bf16 first: the same bytes as pad_indexer_queries
  // (dsa_glue/dsa_fast_inputs.h) followed by this, in one launch.
  const float* queries_f32 = nullptr;
  const float* head_weights_f32 = nullptr;
  int source_heads = 0;
  // The f32 form's weights times this first (heads^-0.5 for the raw
  // weights_proj output: the same product the model's separate scale kernel made).
  float head_weight_scale = 1.0f;
  uint8_t* queries_fp8 = nullptr;  // [rows, heads, 128] out
  float* weights = nullptr;        // [rows, heads] out: head_weights * q scale * softmax_scale
  int rows = 0;
  int heads = 0;
  float softmax_scale = 0;  // 128^-0.5
};

// Both validate their parameters (megactx::Error) and launch on `stream`.
void indexer_scores(const IndexerScoreParams& params, cudaStream_t stream);
void quantize_indexer_queries(const QuantizeIndexerParams& params, cudaStream_t stream);

namespace detail {
void launch_indexer_scores(const IndexerScoreParams& params, cudaStream_t stream);
void launch_quantize_indexer_queries(const QuantizeIndexerParams& params, cudaStream_t stream);
}  // namespace detail

}  // namespace megactx::cuda
