// Parameter checks for the radix top-k (host side: formats messages).
#include "kernels/cuda/topk/topk.h"

#include <cstdlib>

#include "core/error.h"

namespace megactx::cuda {

bool topk_cluster_serves(const TopkParams& params) {
  return params.rows <= kTopkClusterMaxRows && params.max_visible <= kTopkClusterMaxVisible;
}

TopkPath topk_path_chosen(const TopkParams& params) {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_TOPK_CLUSTER");
    return value == nullptr || value[0] != '0';
  }();
  if (params.path != TopkPath::Auto) return params.path;
  return on && topk_cluster_serves(params) && params.max_visible > kTopkClusterMinVisible &&
                 detail::cluster_topk_resident()
             ? TopkPath::Cluster
             : TopkPath::Passes;
}

void radix_topk(const TopkParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.top_k >= 1, "top-k: k must be positive, got {}", params.top_k);
  MEGACTX_CHECK(params.rows >= 0, "top-k: negative row count {}", params.rows);
  MEGACTX_CHECK(params.max_visible >= 0 && params.score_stride >= params.max_visible,
                "top-k: score_stride {} < max_visible {}", params.score_stride, params.max_visible);
  // Positions mode (no block table) needs neither row_request nor a stride.
  const bool slots_mode = params.block_table != nullptr;
  if (slots_mode)
    MEGACTX_CHECK(params.block_table_stride * int64_t{kPageTokens} >= params.max_visible,
                  "top-k: block table of {} pages cannot hold {} keys", params.block_table_stride,
                  params.max_visible);
  if (params.rows > 0) {
    MEGACTX_CHECK(params.scores && params.row_visible && params.out_slots && params.histogram &&
                      params.row_state,
                  "top-k: a required pointer is null");
    MEGACTX_CHECK(!slots_mode || params.row_request,
                  "top-k: a block table needs row_request (or pass no table for positions)");
  }
  if (topk_path_chosen(params) == TopkPath::Cluster) {
    MEGACTX_CHECK(topk_cluster_serves(params),
                  "top-k: the cluster kernel takes at most {} rows of {} keys, got {} rows of {}",
                  kTopkClusterMaxRows, kTopkClusterMaxVisible, params.rows, params.max_visible);
    MEGACTX_CHECK(detail::cluster_topk_resident(),
                  "top-k: this GPU cannot hold a cluster of {} CTAs of the cluster kernel",
                  kTopkClusterCtas);
    detail::launch_cluster_topk(params, stream);
    return;
  }
  detail::launch_radix_topk(params, stream);
}

}  // namespace megactx::cuda
