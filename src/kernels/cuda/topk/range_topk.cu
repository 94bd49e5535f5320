// The range-binned select of topk.h (TopkPath::RangeBins): one CTA per row of
// at most kTopkRangeMaxVisible keys, the row's keys in registers, in one launch.
//
// Why: a decode step's rows of a few thousand keys went through the one-CTA
// radix kernel at ~11.7 us per row at 8K keys (H100), most of it in its first
// digit: bits 31..20 of an ordered float are its sign, exponent and three
// mantissa bits, so a row of scores within an octave or two lands in a
// handful of the 4096 bins, and a thousand threads add into the same few
// shared-memory words.
//
// Here each level bins the keys still in play *linearly over their own
// range*: [lo, hi] starts as the row's smallest and largest ordered key, and
// bin = (key - lo) >> shift with the smallest shift that leaves at most
// kRangeBins bins. Scores spread over the bins as they spread over their
// range, so the histogram's adds rarely collide. The bin holding the k-th
// largest key becomes the next level's [lo, hi]; it is exact on integers, so
// the range shrinks by ~2^11 per level and ends at one key value (ties) after
// at most three levels, usually earlier: a level stops the loop once its bin
// holds exactly the keys still needed.
//
// The collect counts each thread's keys above hi and in [lo, hi] and takes
// its output offsets from one block-wide scan instead of atomics: the
// selection and its order (thread, then key slot) are the same on every run,
// ties included (the first ones in that order are taken).
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/topk/topk.h"
#include "kernels/cuda/topk/topk_slots.cuh"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kRangeBinBits = 11;
constexpr int kRangeBins = 1 << kRangeBinBits;  // two per thread in the scan
static_assert(kRangeBins == 2 * kThreads);
static_assert(kTopkRangeMaxVisible <= 16 * kThreads, "16 keys per thread in registers at most");
// The collect packs a thread's two counts into one scanned word: above << 16 | ties.
static_assert(kTopkRangeMaxVisible < (1 << 16));

using BlockScan = cub::BlockScan<uint32_t, kThreads>;

struct RangeShared {
  uint32_t histogram[kRangeBins];
  typename BlockScan::TempStorage scan;
  uint32_t warp_low[kThreads / 32], warp_high[kThreads / 32];
  uint32_t next_low, next_high, next_need, next_settled;
};

// kPerThread keys per thread: position j * kThreads + threadIdx.x is key j.
template <int kPerThread>
__global__ void __launch_bounds__(kThreads) topk_range_bins(TopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ RangeShared shared;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int64_t row = blockIdx.x;
  const int visible = p.row_visible[row];
  const int k = p.top_k;
  const int taken = min(k, visible);
  int32_t* out = p.out_slots + row * k;
  int32_t* out_positions = p.out_positions != nullptr ? p.out_positions + row * k : nullptr;
  const int32_t* table = row_table(p, static_cast<int>(row));
  // Entry i of the selection is `position`.
  auto put = [&](uint32_t i, int position) {
    out[i] = position_to_slot(table, position);
    if (out_positions != nullptr) out_positions[i] = position;
  };
  for (int i = taken + tid; i < k; i += kThreads) {
    out[i] = -1;
    if (out_positions != nullptr) out_positions[i] = -1;
  }
  if (visible <= k) {  // every position is taken
    for (int position = tid; position < visible; position += kThreads)
      put(static_cast<uint32_t>(position), position);
    return;
  }

  // The row's ordered keys and their range.
  const float* row_scores = p.scores + row * p.score_stride;
  uint32_t key[kPerThread];
  uint32_t low = 0xffffffffu, high = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int position = j * kThreads + tid;
    key[j] = position < visible ? float_to_ordered(__ldcg(row_scores + position)) : 0u;
    if (position < visible) {
      low = min(low, key[j]);
      high = max(high, key[j]);
    }
  }
  auto valid = [&](int j) { return j * kThreads + tid < visible; };
  shared.histogram[2 * tid] = 0;
  shared.histogram[2 * tid + 1] = 0;
  low = __reduce_min_sync(0xffffffffu, low);
  high = __reduce_max_sync(0xffffffffu, high);
  if (lane == 0) {
    shared.warp_low[warp] = low;
    shared.warp_high[warp] = high;
  }
  __syncthreads();
  uint32_t lo = __reduce_min_sync(0xffffffffu, shared.warp_low[lane]);
  uint32_t hi = __reduce_max_sync(0xffffffffu, shared.warp_high[lane]);

  // Levels: the k-th largest key lies in [lo, hi], and `need` keys of that
  // range are still to be taken (the keys above hi are all taken).
  uint32_t need = static_cast<uint32_t>(k);
  while (hi != lo) {  // lo, hi and need are the same in every thread
    const uint32_t range = hi - lo;
    const int shift = max(0, 32 - __clz(range) - kRangeBinBits);  // (range >> shift) < kRangeBins
#pragma unroll
    for (int j = 0; j < kPerThread; ++j)
      if (valid(j) && key[j] >= lo && key[j] <= hi)
        atomicAdd(&shared.histogram[(key[j] - lo) >> shift], 1u);
    __syncthreads();
    // Thread t owns bins kRangeBins-1-2t (upper) and kRangeBins-2-2t: the
    // exclusive scan of their sums is the count of keys in higher bins.
    const int upper_bin = kRangeBins - 1 - 2 * tid;
    const uint32_t upper = shared.histogram[upper_bin];
    const uint32_t lower = shared.histogram[upper_bin - 1];
    shared.histogram[upper_bin] = 0;  // only this thread reads its bins: ready for the next level
    shared.histogram[upper_bin - 1] = 0;
    uint32_t above = 0;
    BlockScan(shared.scan).ExclusiveSum(upper + lower, above);
    if (above < need && above + upper + lower >= need) {
      const bool in_upper = above + upper >= need;
      const uint32_t bin = static_cast<uint32_t>(in_upper ? upper_bin : upper_bin - 1);
      const uint32_t before = in_upper ? above : above + upper;  // keys in higher bins
      const uint32_t here = in_upper ? upper : lower;
      const uint32_t bin_low = lo + (bin << shift);
      const uint64_t bin_high = static_cast<uint64_t>(bin_low) + ((uint64_t{1} << shift) - 1);
      shared.next_low = bin_low;
      shared.next_high = static_cast<uint32_t>(min(bin_high, static_cast<uint64_t>(hi)));
      shared.next_need = need - before;
      shared.next_settled = here == need - before;  // the whole bin is taken
    }
    __syncthreads();
    lo = shared.next_low;
    hi = shared.next_high;
    need = shared.next_need;
    if (shared.next_settled) break;
    // The next writes of next_* follow the next level's first barrier, which
    // every thread reaches after these reads.
  }

  // Collect: keys above hi, then the first `need` keys of [lo, hi] (with a
  // settled bin that is all of them), at offsets from one scan.
  uint32_t above_count = 0, tie_count = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (!valid(j)) continue;
    above_count += key[j] > hi;
    tie_count += key[j] >= lo && key[j] <= hi;
  }
  uint32_t offsets = 0;
  BlockScan(shared.scan).ExclusiveSum((above_count << 16) | tie_count, offsets);
  uint32_t above_at = offsets >> 16, tie_at = offsets & 0xffffu;
  const uint32_t above_total = static_cast<uint32_t>(taken) - need;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (!valid(j)) continue;
    const int position = j * kThreads + tid;
    if (key[j] > hi) {
      put(above_at++, position);
    } else if (key[j] >= lo) {
      if (tie_at < need) put(above_total + tie_at, position);
      ++tie_at;
    }
  }
}

template <int kPerThread>
void launch_with(const TopkParams& params, cudaStream_t stream) {
  launch_kernel(topk_range_bins<kPerThread>, static_cast<unsigned>(params.rows), kThreads, 0,
                stream, params);
}

}  // namespace

namespace detail {

void launch_range_topk(const TopkParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  const int per_thread = (std::max(1, params.max_visible) + kThreads - 1) / kThreads;
  if (per_thread <= 1)
    launch_with<1>(params, stream);
  else if (per_thread <= 2)
    launch_with<2>(params, stream);
  else if (per_thread <= 4)
    launch_with<4>(params, stream);
  else if (per_thread <= 8)
    launch_with<8>(params, stream);
  else
    launch_with<16>(params, stream);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
