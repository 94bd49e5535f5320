// Parameter checks of the fused indexer + top-k (host side: formats messages).
#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/indexer_topk/fused_workspace.h"

namespace megactx::cuda {

size_t fused_indexer_topk_workspace_bytes(int64_t rows, int ctas) {
  return fused::workspace_layout(rows, ctas).total;
}

int fused_indexer_topk_default_ctas() {
  return current_device_multiprocessors();
}

void fused_indexer_topk(const FusedIndexerTopkParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.heads == 32 || params.heads == 64,
                "fused indexer top-k: {} heads (supported: 32, 64)", params.heads);
  MEGACTX_CHECK(params.top_k >= 1 && params.top_k <= kFusedMaxTopk,
                "fused indexer top-k: k = {} (supported: 1..{})", params.top_k, kFusedMaxTopk);
  MEGACTX_CHECK(params.rows >= 0, "fused indexer top-k: negative row count {}", params.rows);
  MEGACTX_CHECK(params.max_visible >= 0, "fused indexer top-k: negative max_visible {}",
                params.max_visible);
  MEGACTX_CHECK(params.ctas >= 0, "fused indexer top-k: negative CTA count {}", params.ctas);
  MEGACTX_CHECK(!(params.wgmma && params.ping_pong && params.tensor_head_sum),
                "fused indexer top-k: ping-pong is a variant of the fp32 head sum "
                "(tensor_head_sum = false)");
  MEGACTX_CHECK(params.consumer_warpgroups == 0 || params.consumer_warpgroups == 2 ||
                    params.consumer_warpgroups == 4,
                "fused indexer top-k: {} consumer warpgroups (supported: 0 = default, 2, 4)",
                params.consumer_warpgroups);
  MEGACTX_CHECK(
      params.consumer_warpgroups != 4 || (params.wgmma && params.tensor_head_sum),
      "fused indexer top-k: four consumer warpgroups need the wgmma tensor-core head sum");
  MEGACTX_CHECK(params.check_pages == 0 || params.check_pages == 1 || params.check_pages == 4,
                "fused indexer top-k: a compaction check every {} pages (supported: 0 = the "
                "default, 1, 4)",
                params.check_pages);
  MEGACTX_CHECK(params.check_pages != 4 ||
                    (params.wgmma && params.tensor_head_sum && params.consumer_warpgroups != 2),
                "fused indexer top-k: a compaction check every {} pages needs the four-warpgroup "
                "tensor-core head sum",
                params.check_pages);
  if (params.rows == 0) return;
  MEGACTX_CHECK(params.queries && params.weights && params.key_pool && params.page_tables &&
                    params.row_table && (params.row_visible || params.row_positions) &&
                    params.out && params.workspace,
                "fused indexer top-k: a required pointer is null");
  MEGACTX_CHECK(reinterpret_cast<uintptr_t>(params.key_pool) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(params.queries) % 16 == 0,
                "fused indexer top-k: key pool and queries must be 16-byte aligned");
  MEGACTX_CHECK(reinterpret_cast<uintptr_t>(params.workspace) % 256 == 0,
                "fused indexer top-k: workspace not 256-byte aligned");
  MEGACTX_CHECK(params.debug_scores == nullptr || params.debug_stride >= params.max_visible,
                "fused indexer top-k: debug_stride {} < max_visible {}", params.debug_stride,
                params.max_visible);
  const int ctas = params.ctas > 0 ? params.ctas : fused_indexer_topk_default_ctas();
  const size_t needed = fused_indexer_topk_workspace_bytes(params.rows, ctas);
  MEGACTX_CHECK(params.workspace_bytes >= needed,
                "fused indexer top-k: workspace of {} bytes, {} rows on {} CTAs need {}",
                params.workspace_bytes, params.rows, ctas, needed);
  detail::launch_fused_indexer_topk(params, ctas, stream);
}

}  // namespace megactx::cuda
