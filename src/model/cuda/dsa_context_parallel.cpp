// CudaDsaModel::context_rows and gather_context_rows: context parallelism on
// GPUs (ModelPlan::context_parallel_size > 1: over the whole group, the
// weights whole on every rank, or over shares of tensor-parallel ranks, whose
// sums stay within a share and whose gathers go across the shares), as the
// host model's (dsa_model.cpp), in the form that needs the fewest changes to
// the attention path:
//   * every rank keeps the whole residual stream x [n, H] of the step and
//     writes every row's latent and indexer key into its (whole) cache, so
//     the q_a | kv_a and wk GEMMs run over all rows on every rank (about 4%
//     of a GLM-5.2 layer's GEMM FLOPs per row);
//   * the expensive rest (the indexer's scores and top-k, the queries, the
//     sparse attention, o_proj, the MLP or MoE) runs for the rank's
//     contiguous share of the rows only, and each of the two branch outputs
//     [n, H] is completed by one all_gather of the shares (padded to the
//     longest) before the residual add, so x stays the same on every rank
//     and every rank computes the logits itself.
// A step of fewer rows than ranks runs whole on every rank (decode of small
// batches), as on the CPU. Decode steps and MTP runs run as CUDA Graphs like
// any others (the shares of the padded rows; the gathers' sizes depend on
// them only), with the experts split by the gathered dispatch
// (expert_dispatch.h).
#if MEGACTX_HAVE_CUDA
#include <algorithm>

#include "core/error.h"
#include "model/cuda/cuda_dsa_model.h"

namespace megactx::cuda {

std::pair<int64_t, int64_t> CudaDsaModel::context_rows(int64_t n) const {
  const int size = plan_.context_parallel_size;
  if (size <= 1 || n < size) return {0, n};
  return share_rows(n, plan_.context_parallel_rank, size);
}

void CudaDsaModel::gather_context_rows(void* data, int64_t row_bytes, int64_t pitch, int64_t n,
                                       int64_t first, int64_t last) {
  MEGACTX_CHECK(group_ != nullptr, "context parallelism needs the group");
  const int size = plan_.context_parallel_size;
  const int64_t longest = share_rows(n, 0, size).second;  // rank 0's share is a longest
  if (longest == 0) return;
  auto* bytes = static_cast<uint8_t*>(data);
  auto* mine = scratch_.context_mine.get<uint8_t>(longest * row_bytes);
  auto* all = scratch_.context_all.get<uint8_t>(size * longest * row_bytes);
  const auto width = static_cast<size_t>(row_bytes);
  if (last > first) {
    MEGACTX_CUDA_CHECK(
        cudaMemcpy2DAsync(mine, width, bytes + first * pitch, static_cast<size_t>(pitch), width,
                          static_cast<size_t>(last - first), cudaMemcpyDeviceToDevice, stream_));
  }
  context_group_->all_gather(mine, all, longest * row_bytes);
  for (int r = 0; r < size; ++r) {
    const auto [from, to] = share_rows(n, r, size);
    if (to == from || r == plan_.context_parallel_rank) continue;
    MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(
        bytes + from * pitch, static_cast<size_t>(pitch), all + r * longest * row_bytes, width,
        width, static_cast<size_t>(to - from), cudaMemcpyDeviceToDevice, stream_));
  }
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
