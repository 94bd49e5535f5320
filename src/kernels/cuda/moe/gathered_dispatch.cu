// The gathered MoE dispatch's two device steps (gathered_dispatch.h): plain
// grid-stride loops over the elements, one thread per output word.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/moe/gathered_dispatch.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) { return grid_stride_blocks(count, kThreads); }

__global__ void localize_kernel(const int32_t* routing, int64_t ranks, int64_t pairs_per_rank,
                                int64_t first_expert, int64_t local_experts, int32_t* local_ids,
                                float* gates) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < ranks * pairs_per_rank;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t rank = t / pairs_per_rank, pair = t % pairs_per_rank;
    const int32_t* block = routing + rank * 2 * pairs_per_rank;
    const int64_t local = int64_t{block[pair]} - first_expert;
    local_ids[t] = local >= 0 && local < local_experts ? static_cast<int32_t>(local) : -1;
    gates[t] = __int_as_float(block[pairs_per_rank + pair]);
  }
}

__global__ void sum_chunks_kernel(const float* chunks, int64_t ranks, int64_t chunk_floats,
                                  int64_t count, const float* shared, float* out) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < count;
       t += int64_t{gridDim.x} * blockDim.x) {
    float sum = chunks[t];
    for (int64_t q = 1; q < ranks; ++q) sum += chunks[q * chunk_floats + t];
    if (shared != nullptr) sum += shared[t];
    out[t] = sum;
  }
}

}  // namespace

void localize_gathered_routing(const int32_t* routing, int64_t ranks, int64_t pairs_per_rank,
                               int64_t first_expert, int64_t local_experts, int32_t* local_ids,
                               float* gates, cudaStream_t stream) {
  if (ranks * pairs_per_rank == 0) return;
  launch_kernel(localize_kernel, blocks_for(ranks * pairs_per_rank), kThreads, 0, stream, routing,
                ranks, pairs_per_rank, first_expert, local_experts, local_ids, gates);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void sum_rank_chunks(const float* chunks, int64_t ranks, int64_t chunk_floats, int64_t count,
                     const float* shared, float* out, cudaStream_t stream) {
  if (count == 0 || ranks < 1) return;  // count <= chunk_floats: the caller's
  launch_kernel(sum_chunks_kernel, blocks_for(count), kThreads, 0, stream, chunks, ranks,
                chunk_floats, count, shared, out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
