// The radix select of topk.h for a few rows of up to kTopkClusterMaxVisible
// scores, in one launch: one thread-block cluster of kTopkClusterCtas CTAs
// per row holds the row's ordered keys in shared memory (read from global
// memory once; up to 48 per thread, 192 KB per CTA) and runs the digit
// levels with cluster barriers instead of kernel boundaries. (Registers
// would hold 16 keys per thread before spilling at 1024 threads.)
//
// Why: a decode step selects one row per request, and the multi-CTA passes
// of radix_topk.cu cost four dependent launches, each with a global
// histogram flush and a ticket (~21 us per row at 128K-1M keys on an H100,
// whatever the length); the one-CTA kernel pulls a 32K row through one SM
// (15 us). Here a level is: histogram in each CTA's shared memory; every CTA
// sums the bins it owns (kTopkHistogramBins / kTopkClusterCtas, descending)
// over the cluster's CTAs through distributed shared memory and scans them;
// the CTA whose segment holds the k-th key picks the digit and writes the
// decision into every CTA. The collect takes output positions from two
// counters in CTA 0's shared memory (one atomic per warp and outcome).
#include <cooperative_groups.h>

#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/topk/topk.h"

namespace megactx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = kTopkClusterThreads;
constexpr int kCtas = kTopkClusterCtas;

// What the selection holds for `position`: its physical slot through the
// row's block table, or the position itself in positions mode.
__device__ __forceinline__ int32_t cluster_slot(const TopkParams& p, int row, int64_t position) {
  if (p.block_table == nullptr) return static_cast<int32_t>(position);
  const int32_t* table =
      p.block_table + static_cast<int64_t>(p.row_request[row]) * p.block_table_stride;
  return table[position / kPageTokens] * kPageTokens + static_cast<int32_t>(position % kPageTokens);
}

// Writes `slot` for every lane whose `take` is set at consecutive output
// indices from *counter (a distributed shared memory counter): one atomic per
// warp. Returns the lane's index (meaningful where take is set).
__device__ __forceinline__ int warp_claim(bool take, int* counter) {
  const unsigned lanes = __ballot_sync(0xffffffffu, take);
  if (lanes == 0) return 0;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int leader = __ffs(lanes) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(lanes));
  base = __shfl_sync(0xffffffffu, base, leader);
  return base + __popc(lanes & ((1u << lane) - 1u));
}

constexpr int kPerPass = kCtas * kThreads;  // keys a cluster holds per key slot of a thread

__global__ void __launch_bounds__(kThreads, 1) topk_cluster_rows(TopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  using BlockScan = cub::BlockScan<int, kThreads>;
  constexpr int kOwned = kTopkHistogramBins / kCtas;  // bins a CTA sums at the 12-bit levels
  __shared__ uint32_t histogram[kTopkHistogramBins];  // this CTA's counts of the level's digit
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int segment_total[kCtas];  // [owner rank] candidates in its bins (every CTA's copy)
  __shared__ int decision[3];           // digit, need left in it, whether it is taken whole
  __shared__ int counters[2];           // CTA 0's: slots above the threshold, ties seen
  extern __shared__ uint32_t keys[];    // [per_thread][kThreads] ordered images of the scores

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = static_cast<int>(blockIdx.x) / kCtas;
  const int visible = p.row_visible[row];
  const int k = p.top_k;
  int32_t* out = p.out_slots + static_cast<int64_t>(row) * k;
  const int tid = static_cast<int>(threadIdx.x);

  if (visible <= k) {  // every key is taken (row-uniform: the whole cluster returns here)
    for (int i = rank * kThreads + tid; i < k; i += kCtas * kThreads)
      out[i] = i < visible ? cluster_slot(p, row, i) : -1;
    return;
  }

  // Key j of this thread is position (j * kCtas + rank) * kThreads + tid:
  // every load instruction of a warp reads 128 contiguous bytes, and the
  // shared-memory slot j * kThreads + tid is conflict-free.
  const float* row_scores = p.scores + static_cast<int64_t>(row) * p.score_stride;
  const int per_thread = (visible + kPerPass - 1) / kPerPass;
#pragma unroll 8
  for (int j = 0; j < per_thread; ++j) {
    const int position = (j * kCtas + rank) * kThreads + tid;
    keys[j * kThreads + tid] =
        position < visible ? float_to_ordered(__ldg(row_scores + position)) : 0u;
  }
  if (rank == 0 && tid < 2) counters[tid] = 0;  // visible to the cluster after the first barrier

  uint32_t prefix = 0;
  int need = k;
  int settled_shift = 0;  // as in radix_topk.cu: the digits below it decide nothing
#pragma unroll
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 20 : (level == 1 ? 8 : 0);
    const int bits = level == 2 ? 8 : 12;
    const int bins = 1 << bits;
    const int owned = level == 2 ? (256 / kCtas) : kOwned;
    for (int i = tid; i < bins; i += kThreads) histogram[i] = 0;
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < per_thread; ++j) {
      const int position = (j * kCtas + rank) * kThreads + tid;
      const uint32_t key = keys[j * kThreads + tid];
      if (position < visible && (level == 0 || (key >> (shift + bits)) == prefix))
        atomicAdd(&histogram[(key >> shift) & (bins - 1)], 1u);
    }
    cluster.sync();  // every CTA's histogram is complete and visible to the cluster

    // Thread t < owned sums bin (rank + 1) * owned - 1 - t over the cluster:
    // this CTA's bins from the top, so the scan counts the candidates above.
    const int bin = (rank + 1) * owned - 1 - tid;
    int own = 0;
    if (tid < owned)
#pragma unroll
      for (int c = 0; c < kCtas; ++c)
        own += static_cast<int>(cluster.map_shared_rank(histogram, c)[bin]);
    int above_here = 0, segment = 0;
    BlockScan(scan_storage).ExclusiveSum(own, above_here, segment);
    if (tid < kCtas) cluster.map_shared_rank(segment_total, tid)[rank] = segment;
    cluster.sync();  // segment totals everywhere; the histograms may be reused

    int above = above_here;  // candidates in the bins of the higher-ranked CTAs come first
    for (int c = rank + 1; c < kCtas; ++c) above += segment_total[c];
    if (tid < owned && above < need && above + own >= need) {
      const int left = need - above;
      for (int c = 0; c < kCtas; ++c) {
        int* remote = cluster.map_shared_rank(decision, c);
        remote[0] = bin;
        remote[1] = left;
        remote[2] = own == left;
      }
    }
    cluster.sync();  // the decision is in every CTA
    prefix = level == 0 ? static_cast<uint32_t>(decision[0])
                        : ((prefix << bits) | static_cast<uint32_t>(decision[0]));
    need = decision[1];
    const bool whole = decision[2] != 0;
    __syncthreads();  // decision is rewritten by the next level
    if (whole) {      // every key of the threshold bin is taken
      settled_shift = shift;
      break;
    }
  }

  int* above_counter = cluster.map_shared_rank(&counters[0], 0);
  int* tie_counter = cluster.map_shared_rank(&counters[1], 0);
  const int above_total = k - need;
  for (int j = 0; j < per_thread; ++j) {  // warp-uniform: claims are warp collectives
    const int position = (j * kCtas + rank) * kThreads + tid;
    const bool valid = position < visible;
    const uint32_t key = keys[j * kThreads + tid] >> settled_shift;
    const bool is_above = valid && key > prefix;
    const bool is_tie = valid && key == prefix;
    const int above_index = warp_claim(is_above, above_counter);
    if (is_above) out[above_index] = cluster_slot(p, row, position);
    const int tie_index = warp_claim(is_tie, tie_counter);
    if (is_tie && tie_index < need) out[above_total + tie_index] = cluster_slot(p, row, position);
  }
  cluster.sync();  // CTA 0's counters stay alive until every CTA has claimed its slots
}

}  // namespace

namespace detail {

void launch_cluster_topk(const TopkParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  constexpr int kMaxShared = kTopkClusterMaxVisible / kCtas * 4;
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
        topk_cluster_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxShared));
    return true;
  }();
  (void)configured;
  const int per_thread = (std::max(params.max_visible, 1) + kPerPass - 1) / kPerPass;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(params.rows * kCtas));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(per_thread) * kThreads * 4;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kCtas;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = programmatic_launch() ? 2 : 1;
  MEGACTX_CUDA_CHECK(cudaLaunchKernelEx(&config, topk_cluster_rows, params));
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
