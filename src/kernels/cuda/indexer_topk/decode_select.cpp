// Parameter checks for the decode scoring-and-selection kernel (host side:
// formats messages).
#include "kernels/cuda/indexer_topk/decode_select.h"

#include <cstdint>
#include <cstdlib>

#include "core/error.h"

namespace megactx::cuda {

bool decode_select_serves(int rows, int heads, int max_visible) {
  return rows >= 0 && rows <= kDecodeSelectMaxRows && (heads == 32 || heads == 64) &&
         max_visible >= 0 && max_visible <= kDecodeSelectMaxVisible &&
         detail::decode_select_resident();
}

bool decode_select_enabled() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_DECODE_SELECT");
    return value != nullptr && value[0] == '1';
  }();
  return on;
}

void decode_indexer_select(const DecodeSelectParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.heads == 32 || params.heads == 64,
                "decode select: {} heads (supported: 32, 64)", params.heads);
  MEGACTX_CHECK(params.top_k >= 1, "decode select: k must be positive, got {}", params.top_k);
  MEGACTX_CHECK(params.rows >= 0 && params.rows <= kDecodeSelectMaxRows,
                "decode select: {} rows (at most {})", params.rows, kDecodeSelectMaxRows);
  MEGACTX_CHECK(params.max_visible >= 0 && params.max_visible <= kDecodeSelectMaxVisible,
                "decode select: {} keys per row (at most {})", params.max_visible,
                kDecodeSelectMaxVisible);
  MEGACTX_CHECK(params.block_table_stride * int64_t{kPageTokens} >= params.max_visible,
                "decode select: block table of {} pages cannot hold {} keys",
                params.block_table_stride, params.max_visible);
  MEGACTX_CHECK(params.scores == nullptr || params.score_stride >= params.max_visible,
                "decode select: score_stride {} < max_visible {}", params.score_stride,
                params.max_visible);
  if (params.rows > 0)
    MEGACTX_CHECK(params.queries && params.weights && params.key_pool && params.block_table &&
                      params.row_request && params.row_visible && params.out,
                  "decode select: a required pointer is null");
  MEGACTX_CHECK(reinterpret_cast<uintptr_t>(params.key_pool) % 16 == 0,
                "decode select: key pool not 16-byte aligned");
  MEGACTX_CHECK(detail::decode_select_resident(),
                "decode select: this GPU cannot hold a cluster of {} CTAs of the kernel",
                kDecodeSelectCtas);
  detail::launch_decode_indexer_select(params, stream);
}

}  // namespace megactx::cuda
