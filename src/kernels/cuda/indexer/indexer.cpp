// Parameter checks for the indexer kernels (host side: formats messages).
#include "kernels/cuda/indexer/indexer.h"

#include "core/error.h"

namespace megactx::cuda {

void indexer_scores(const IndexerScoreParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.heads == 32 || params.heads == 64, "indexer: {} heads (supported: 32, 64)",
                params.heads);
  MEGACTX_CHECK(params.rows_per_group >= 1 && params.rows_per_group <= 8,
                "indexer: rows_per_group {} (must be 1..8)", params.rows_per_group);
  MEGACTX_CHECK(params.rows >= 0 && params.rows % params.rows_per_group == 0,
                "indexer: {} rows is not a multiple of rows_per_group {}", params.rows,
                params.rows_per_group);
  MEGACTX_CHECK(params.max_visible >= 0, "indexer: negative max_visible {}", params.max_visible);
  MEGACTX_CHECK(params.score_stride >= params.max_visible,
                "indexer: score_stride {} < max_visible {}", params.score_stride,
                params.max_visible);
  MEGACTX_CHECK(params.block_table_stride * int64_t{kPageTokens} >= params.max_visible,
                "indexer: block table of {} pages cannot hold {} keys", params.block_table_stride,
                params.max_visible);
  if (params.rows > 0)
    MEGACTX_CHECK(params.queries && params.weights && params.key_pool && params.block_table &&
                      params.row_request && params.row_visible && params.scores,
                  "indexer: a required pointer is null");
  MEGACTX_CHECK(reinterpret_cast<uintptr_t>(params.key_pool) % 16 == 0,
                "indexer: key pool not 16-byte aligned");
  detail::launch_indexer_scores(params, stream);
}

void quantize_indexer_queries(const QuantizeIndexerParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.rows >= 0 && params.heads > 0,
                "quantize_indexer_queries: bad shape [{}, {}]", params.rows, params.heads);
  MEGACTX_CHECK(params.softmax_scale > 0,
                "quantize_indexer_queries: softmax_scale must be positive");
  const bool from_f32 = params.queries_f32 != nullptr;
  MEGACTX_CHECK(from_f32 ? params.queries == nullptr && params.head_weights == nullptr &&
                               params.head_weights_f32 != nullptr && params.source_heads > 0 &&
                               params.source_heads <= params.heads
                         : params.queries != nullptr && params.head_weights != nullptr,
                "quantize_indexer_queries: give bf16 queries and weights, or float32 ones with "
                "0 < source_heads <= heads");
  detail::launch_quantize_indexer_queries(params, stream);
}

}  // namespace megactx::cuda
