// The radix select of topk.h for a few rows, in one launch: one thread-block
// cluster per row runs the digit levels with cluster barriers instead of
// kernel boundaries.
//
// Why: a decode step selects one row per request, and the multi-CTA passes
// of radix_topk.cu cost four dependent launches, each with a global
// histogram flush and a ticket (~21 us per row at 128K-1M keys on an H100,
// whatever the length); the one-CTA kernel pulls a 32K row through one SM
// (15 us).
//
// A level (decide_digit): a histogram in each CTA's shared memory; every CTA
// sums the bins it owns (a 1 / C share of them, descending) over the
// cluster's CTAs through distributed shared memory and scans them; the CTA
// whose segment holds the k-th key picks the digit and writes the decision
// into every CTA. The collect takes output positions from two counters in
// CTA 0's shared memory (one atomic per warp and outcome).
// (Every CTA summing the whole cluster's histogram and deciding alone, one
// cluster barrier per digit instead of three, was measured slower on an
// H100: 18 against 12 us at 32K keys; the remote loads cost more than the
// barriers. docs/benchmarks.md.)
//
// The row's ordered keys live in the CTAs' shared memory (read from global
// memory once; up to 48 per thread, 192 KB per CTA). Registers would hold 16
// keys per thread before spilling at 1024 threads. A streamed variant for
// longer rows (the first digit from the scores in global memory, its bin's
// keys as shared-memory candidates) was measured on the H200 and not kept:
// 29.5 / 45.5 us at 512K / 1M keys against the passes' 19.3 / 19.2, one SM's
// share of the L2 bandwidth per CTA being too little for 1M scores
// (docs/benchmarks.md).
#include <cooperative_groups.h>

#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/topk/topk.h"
#include "kernels/cuda/topk/topk_slots.cuh"

namespace megactx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = kTopkClusterThreads;
constexpr int kCtas = kTopkClusterCtas;
constexpr int kPerPass = kCtas * kThreads;  // keys a cluster holds per key slot of a thread
constexpr int kMaxDynamicShared = kTopkClusterMaxVisible / kCtas * 4;
using BlockScan = cub::BlockScan<int, kThreads>;

// Index of this lane's item among the lanes of its warp whose `take` is set,
// counted on from *counter (shared or distributed shared memory): one atomic
// per warp. Every lane of the warp must call it. Meaningful where take is set.
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

// Shared memory of one CTA for the levels.
struct LevelShared {
  uint32_t histogram[kTopkHistogramBins];  // this CTA's counts of the level's digit
  typename BlockScan::TempStorage scan;
  int segment_total[kCtas];  // [owner rank] candidates in its bins (every CTA's copy)
  int decision[3];           // digit, need left in its bin, whether the bin is taken whole
  int counters[2];           // CTA 0's: slots above the threshold, ties seen
};

struct Digit {
  uint32_t prefix;  // the threshold's digits so far
  int need;         // keys of the threshold bin still to take
  bool whole;       // the bin's keys are exactly those: the lower digits decide nothing
};

// The level's digit from the CTAs' complete local histograms (of `bins` bins;
// the caller has filled them since its last barrier). Ends with the decision
// in every CTA and the histograms free for the next level.
__device__ Digit decide_digit(cg::cluster_group& cluster, LevelShared& s, int rank, int bins,
                              int bits, uint32_t prefix, int need) {
  const int tid = static_cast<int>(threadIdx.x);
  const int owned = bins / kCtas;
  cluster.sync();  // every CTA's histogram is complete and visible to the cluster
  // Thread t < owned sums bin (rank + 1) * owned - 1 - t over the cluster:
  // this CTA's bins from the top, so the scan counts the candidates above.
  const int bin = (rank + 1) * owned - 1 - tid;
  int own = 0;
  if (tid < owned)
#pragma unroll
    for (int c = 0; c < kCtas; ++c)
      own += static_cast<int>(cluster.map_shared_rank(s.histogram, c)[bin]);
  int above_here = 0, segment = 0;
  BlockScan(s.scan).ExclusiveSum(own, above_here, segment);
  if (tid < kCtas) cluster.map_shared_rank(s.segment_total, tid)[rank] = segment;
  cluster.sync();  // segment totals everywhere; the histograms may be reused

  int above = above_here;  // candidates in the bins of the higher-ranked CTAs come first
  for (int c = rank + 1; c < kCtas; ++c) above += s.segment_total[c];
  if (tid < owned && above < need && above + own >= need) {
    const int left = need - above;
    for (int c = 0; c < kCtas; ++c) {
      int* remote = cluster.map_shared_rank(s.decision, c);
      remote[0] = bin;
      remote[1] = left;
      remote[2] = own == left;
    }
  }
  cluster.sync();  // the decision is in every CTA
  Digit digit;
  digit.prefix = (prefix << bits) | static_cast<uint32_t>(s.decision[0]);
  digit.need = s.decision[1];
  digit.whole = s.decision[2] != 0;
  __syncthreads();  // decision is rewritten by the next level
  return digit;
}

constexpr int level_shift(int level) {
  return level == 0 ? 20 : (level == 1 ? 8 : 0);
}
constexpr int level_bits(int level) {
  return level == 2 ? 8 : 12;
}

// Rows whose keys fit the CTAs' shared memory: the keys are read once.
__global__ void __launch_bounds__(kThreads, 1) topk_cluster_rows(TopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ LevelShared s;
  extern __shared__ uint32_t keys[];  // [per_thread][kThreads] ordered images of the scores

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = static_cast<int>(blockIdx.x) / kCtas;
  const int visible = p.row_visible[row];
  const int k = p.top_k;
  int32_t* out = p.out_slots + static_cast<int64_t>(row) * k;
  const int32_t* table = row_table(p, row);
  const int tid = static_cast<int>(threadIdx.x);

  if (visible <= k) {  // every key is taken (row-uniform: the whole cluster returns here)
    for (int i = rank * kThreads + tid; i < k; i += kPerPass)
      out[i] = i < visible ? position_to_slot(table, i) : -1;
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
  if (rank == 0 && tid < 2) s.counters[tid] = 0;  // visible to the cluster after a barrier

  Digit digit{0u, k, false};
  int settled_shift = 0;  // as in radix_topk.cu: the digits below it decide nothing
#pragma unroll
  for (int level = 0; level < 3; ++level) {
    const int shift = level_shift(level), bits = level_bits(level), bins = 1 << bits;
    for (int i = tid; i < bins; i += kThreads) s.histogram[i] = 0;
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < per_thread; ++j) {
      const int position = (j * kCtas + rank) * kThreads + tid;
      const uint32_t key = keys[j * kThreads + tid];
      if (position < visible && (level == 0 || (key >> (shift + bits)) == digit.prefix))
        atomicAdd(&s.histogram[(key >> shift) & (bins - 1)], 1u);
    }
    digit = decide_digit(cluster, s, rank, bins, bits, digit.prefix, digit.need);
    if (digit.whole) {  // every key of the threshold bin is taken
      settled_shift = shift;
      break;
    }
  }

  int* above_counter = cluster.map_shared_rank(&s.counters[0], 0);
  int* tie_counter = cluster.map_shared_rank(&s.counters[1], 0);
  const int above_total = k - digit.need;
  for (int j = 0; j < per_thread; ++j) {  // warp-uniform: claims are warp collectives
    const int position = (j * kCtas + rank) * kThreads + tid;
    const bool valid = position < visible;
    const uint32_t key = keys[j * kThreads + tid] >> settled_shift;
    const bool is_above = valid && key > digit.prefix;
    const bool is_tie = valid && key == digit.prefix;
    const int above_index = warp_claim(is_above, above_counter);
    if (is_above) out[above_index] = position_to_slot(table, position);
    const int tie_index = warp_claim(is_tie, tie_counter);
    if (is_tie && tie_index < digit.need)
      out[above_total + tie_index] = position_to_slot(table, position);
  }
  cluster.sync();  // CTA 0's counters stay alive until every CTA has claimed its slots
}

// The kernel's shared-memory limit raised once, before any launch or probe.
void configure() {
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
        topk_cluster_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynamicShared));
    return true;
  }();
  (void)configured;
}

}  // namespace

namespace detail {

bool cluster_topk_resident() {
  // Whether one cluster of 8 CTAs with the largest rows' shared memory can be
  // resident on this GPU (8 SMs of one GPC with ~213 KB free each; a MIG
  // slice or another part may have none).
  static const bool resident = [] {
    configure();
    cudaLaunchAttribute attributes[2];
    const cudaLaunchConfig_t config = cluster_launch_config(
        dim3(kCtas), dim3(kThreads), kMaxDynamicShared, nullptr, kCtas, attributes);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, topk_cluster_rows, &config) != cudaSuccess) {
      (void)cudaGetLastError();
      clusters = 0;
    }
    return clusters > 0;
  }();
  return resident;
}

void launch_cluster_topk(const TopkParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  configure();
  const int per_thread = (std::max(params.max_visible, 1) + kPerPass - 1) / kPerPass;
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config = cluster_launch_config(
      dim3(static_cast<unsigned>(params.rows * kCtas)), dim3(kThreads),
      static_cast<size_t>(per_thread) * kThreads * 4, stream, kCtas, attributes);
  MEGACTX_CUDA_CHECK(cudaLaunchKernelEx(&config, topk_cluster_rows, params));
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
