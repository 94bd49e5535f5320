// Parameter checks and split planning for sparse MLA (host side).
#include "kernels/cuda/sparse_mla/sparse_mla.h"

#include <algorithm>

#include "core/error.h"

namespace megactx::cuda {

int sparse_mla_default_splits(int rows, int heads, int top_k, int multiprocessors) {
  const int64_t ctas = std::max<int64_t>(1, int64_t{rows} * (heads / kSparseMlaHeadBlock));
  const int blocks = std::max(1, (top_k + kSparseMlaKeyBlock - 1) / kSparseMlaKeyBlock);
  const int most = std::max(1, blocks / 2);  // keep at least 64 slots per split
  const int64_t wanted = std::max<int64_t>(1, multiprocessors / ctas);
  return static_cast<int>(std::min<int64_t>(most, wanted));
}

void sparse_mla_attention(const SparseMlaParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.heads > 0 && params.heads % kSparseMlaHeadBlock == 0,
                "sparse MLA: {} heads (must be a positive multiple of {})", params.heads,
                kSparseMlaHeadBlock);
  MEGACTX_CHECK(params.rows >= 0, "sparse MLA: negative row count {}", params.rows);
  MEGACTX_CHECK(params.top_k >= 1, "sparse MLA: top_k must be positive, got {}", params.top_k);
  const int blocks = (params.top_k + kSparseMlaKeyBlock - 1) / kSparseMlaKeyBlock;
  MEGACTX_CHECK(params.num_splits >= 1 && params.num_splits <= blocks,
                "sparse MLA: num_splits {} outside 1..{}", params.num_splits, blocks);
  MEGACTX_CHECK(params.softmax_scale > 0, "sparse MLA: softmax_scale must be positive");
  if (params.rows > 0) {
    MEGACTX_CHECK(params.q && params.slots && params.kv_pool && params.out && params.lse,
                  "sparse MLA: a required pointer is null");
    MEGACTX_CHECK(params.num_splits == 1 || (params.partial_out && params.partial_lse),
                  "sparse MLA: {} splits need partial_out and partial_lse", params.num_splits);
    MEGACTX_CHECK(reinterpret_cast<uintptr_t>(params.kv_pool) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(params.q) % 16 == 0,
                  "sparse MLA: q and kv_pool must be 16-byte aligned");
  }
  detail::launch_sparse_mla(params, stream);
}

}  // namespace megactx::cuda
