// The former top-k of the fallback indexer, kept for the benchmark and as a
// second reference of the GPU tests (position_topk_quadratic.h).
#include "bench/cuda/support/position_topk_quadratic.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;

__device__ bool ranks_above(float va, int64_t a, float vb, int64_t b) {
  return va > vb || (va == vb && a < b);
}

// One block per row. Phase 1: every visible position with rank < topk goes to
// indices[rank] (ranks are distinct). Phase 2: those are reordered by position
// through shared memory ([topk] ints).
__global__ void quadratic_topk_kernel(PositionTopkParams p) {
  extern __shared__ int32_t sorted[];
  const int64_t t = blockIdx.x;
  const int64_t last = p.positions[t];
  const int64_t visible = last < 0 ? 0 : (last + 1 < p.max_context ? last + 1 : p.max_context);
  const float* s = p.scores + t * p.score_stride;
  int32_t* out = p.indices + t * p.topk;
  const int64_t count = visible < p.topk ? visible : p.topk;
  for (int64_t pos = threadIdx.x; pos < visible; pos += blockDim.x) {
    int64_t rank = 0;
    for (int64_t o = 0; o < visible && rank < p.topk; ++o)
      rank += ranks_above(s[o], o, s[pos], pos);
    if (rank < p.topk) out[rank] = static_cast<int32_t>(pos);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const int32_t mine = out[i];
    int64_t before = 0;
    for (int64_t o = 0; o < count; ++o) before += out[o] < mine ? 1 : 0;
    sorted[before] = mine;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.topk; i += blockDim.x) out[i] = i < count ? sorted[i] : -1;
  if (threadIdx.x == 0) p.counts[t] = static_cast<int32_t>(count);
}

}  // namespace

namespace detail {

void launch_position_topk_quadratic(const PositionTopkParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  const size_t sort_bytes = static_cast<size_t>(params.topk) * sizeof(int32_t);
  quadratic_topk_kernel<<<static_cast<unsigned>(params.rows), kThreads, sort_bytes, stream>>>(
      params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
