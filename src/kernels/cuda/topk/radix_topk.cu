// Multi-CTA radix select (see topk.h for the algorithm and the workspace rules).
//
// Row state (int32 x kTopkRowState per row):
//   [0] ticket of the digit pass in flight   [1] threshold prefix so far (uint32 bits)
//   [2] how many scores tied with the prefix are still needed (the k-th lies there)
//   [3] slots written above the threshold    [4] ties seen at the threshold
//   [5] ticket of the collect pass
//   [6] settled: 1 + the shift of the digit whose bin holds exactly the ties
//       still needed (every one of them is taken, so the lower digits'
//       passes return at once and the collect compares key >> shift); 0 while
//       open. With distinct scores that is usually the second pass.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/topk/topk.h"
#include "kernels/cuda/topk/topk_slots.cuh"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 512;

// Level 0: digit = bits 31..20 of all scores; level 1: bits 19..8 of those whose
// bits 31..20 equal the prefix; level 2: bits 7..0 of those matching bits 31..8.
template <int Level>
__global__ void __launch_bounds__(kThreads) topk_digit_pass(TopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  constexpr int kShift = Level == 0 ? 20 : (Level == 1 ? 8 : 0);
  constexpr int kDigitBits = Level == 2 ? 8 : 12;
  constexpr int kBins = 1 << kDigitBits;
  constexpr int kPrefixShift = kShift + kDigitBits;
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ uint32_t histogram[kBins];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int is_last;

  const int row = blockIdx.y;
  const int visible = p.row_visible[row];
  if (visible <= p.top_k) return;  // every position is taken: the collect pass does it alone
  int32_t* state = p.row_state + static_cast<int64_t>(row) * kTopkRowState;
  if (Level > 0 && state[6] != 0) return;  // settled by an earlier pass (its tickets are reset)
  const uint32_t prefix = Level == 0 ? 0u : static_cast<uint32_t>(state[1]);
  const int need = Level == 0 ? p.top_k : state[2];

  for (int i = threadIdx.x; i < kBins; i += kThreads) histogram[i] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTopkChunk;
  const int64_t end = min(begin + kTopkChunk, static_cast<int64_t>(visible));
  const float* row_scores = p.scores + static_cast<int64_t>(row) * p.score_stride;
  for (int64_t position = begin + threadIdx.x; position < end; position += kThreads) {
    const uint32_t key = float_to_ordered(row_scores[position]);
    bool matches = true;
    if constexpr (Level > 0) matches = (key >> kPrefixShift) == prefix;
    if (matches) atomicAdd(&histogram[(key >> kShift) & (kBins - 1)], 1u);
  }
  __syncthreads();
  uint32_t* row_histogram = p.histogram + static_cast<int64_t>(row) * kTopkHistogramBins;
  for (int i = threadIdx.x; i < kBins; i += kThreads)
    if (histogram[i] != 0) atomicAdd(&row_histogram[i], histogram[i]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&state[0], 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!is_last) return;

  // Last CTA of this row: the complete histogram is in global memory.
  __threadfence();
  for (int i = threadIdx.x; i < kBins; i += kThreads) histogram[i] = __ldcg(&row_histogram[i]);
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += kThreads) row_histogram[i] = 0;
  // Thread i owns the bins_per_thread bins i-th from the top; count above them.
  constexpr int kPerThread = kBins >= kThreads ? kBins / kThreads : 1;
  const int top = kBins - threadIdx.x * kPerThread;  // exclusive upper bin
  int own = 0;
  if (top > 0)
    for (int b = top - 1; b >= top - kPerThread; --b) own += static_cast<int>(histogram[b]);
  int above = 0;
  BlockScan(scan_storage).ExclusiveSum(own, above);
  if (top > 0 && above < need && above + own >= need) {
    int count = above;
    for (int b = top - 1; b >= top - kPerThread; --b) {
      const int here = static_cast<int>(histogram[b]);
      if (count + here >= need) {
        state[1] = static_cast<int32_t>((Level == 0 ? 0u : (prefix << kDigitBits)) |
                                        static_cast<uint32_t>(b));
        state[2] = need - count;
        if (here == need - count) state[6] = kShift + 1;  // the whole bin is taken
        break;
      }
      count += here;
    }
  }
  if (threadIdx.x == 0) state[0] = 0;
}

__global__ void __launch_bounds__(kThreads) topk_collect(TopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ int is_last;
  const int row = blockIdx.y;
  const int visible = p.row_visible[row];
  const int k = p.top_k;
  const int taken = min(k, visible);
  int32_t* out = p.out_slots + static_cast<int64_t>(row) * k;
  int32_t* state = p.row_state + static_cast<int64_t>(row) * kTopkRowState;
  const int32_t* table = row_table(p, static_cast<int>(row));
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTopkChunk;
  const int64_t end = min(begin + kTopkChunk, static_cast<int64_t>(visible));

  if (visible <= k) {
    for (int64_t position = begin + threadIdx.x; position < end; position += kThreads)
      out[position] = position_to_slot(table, position);
  } else {
    const uint32_t threshold = static_cast<uint32_t>(state[1]);
    const int ties_needed = state[2];
    const int shift = state[6] != 0 ? state[6] - 1 : 0;  // the settled digit's: compare its prefix
    const int above_total = taken - ties_needed;
    const float* row_scores = p.scores + static_cast<int64_t>(row) * p.score_stride;
    for (int64_t position = begin + threadIdx.x; position < end; position += kThreads) {
      const uint32_t key = float_to_ordered(row_scores[position]) >> shift;
      if (key > threshold) {
        out[atomicAdd(&state[3], 1)] = position_to_slot(table, position);
      } else if (key == threshold) {
        const int tie = atomicAdd(&state[4], 1);
        if (tie < ties_needed) out[above_total + tie] = position_to_slot(table, position);
      }
    }
  }
  if (blockIdx.x == 0)
    for (int i = taken + threadIdx.x; i < k; i += kThreads) out[i] = -1;

  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&state[5], 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (is_last && threadIdx.x < kTopkRowState) state[threadIdx.x] = 0;
}

// Rows of at most kTopkSmallRow scores: one CTA per row keeps the row's
// ordered keys in shared memory and runs the same three digit passes and the
// collect there, in one launch.
constexpr int kSmallThreads = 1024;

__global__ void __launch_bounds__(kSmallThreads) topk_small_rows(TopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint32_t keys[];  // [visible] ordered images of the row's scores
  using BlockScan = cub::BlockScan<int, kSmallThreads>;
  __shared__ uint32_t histogram[kTopkHistogramBins];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int found_digit, found_need, found_whole, above_count, tie_count;

  const int64_t row = blockIdx.x;
  const int visible = p.row_visible[row];
  const int k = p.top_k;
  const int taken = min(k, visible);
  int32_t* out = p.out_slots + row * k;
  const int32_t* table = row_table(p, static_cast<int>(row));
  for (int i = taken + threadIdx.x; i < k; i += kSmallThreads) out[i] = -1;
  if (visible <= k) {
    for (int position = threadIdx.x; position < visible; position += kSmallThreads)
      out[position] = position_to_slot(table, position);
    return;
  }
  // Slots mode: the row's page ids in shared memory, read with the scores, so
  // that the collect maps a position without a dependent global load.
  __shared__ int32_t page_ids[kTopkSmallRow / kPageTokens];
  if (table != nullptr)
    for (int page = threadIdx.x; page < (visible + kPageTokens - 1) / kPageTokens;
         page += kSmallThreads)
      page_ids[page] = table[page];
  const float* row_scores = p.scores + row * p.score_stride;
  for (int position = threadIdx.x; position < visible; position += kSmallThreads)
    keys[position] = float_to_ordered(row_scores[position]);
  const int32_t* row_pages = table != nullptr ? page_ids : nullptr;  // null: positions mode

  uint32_t prefix = 0;
  int need = k;
  int settled_shift = 0;  // the digits below it are not looked at (see [6] above)
#pragma unroll
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 20 : (level == 1 ? 8 : 0);
    const int bits = level == 2 ? 8 : 12;
    const int bins = 1 << bits;
    for (int i = threadIdx.x; i < bins; i += kSmallThreads) histogram[i] = 0;
    __syncthreads();
    for (int position = threadIdx.x; position < visible; position += kSmallThreads) {
      const uint32_t key = keys[position];
      if (level == 0 || (key >> (shift + bits)) == prefix)
        atomicAdd(&histogram[(key >> shift) & (bins - 1)], 1u);
    }
    __syncthreads();
    const int per_thread = bins >= kSmallThreads ? bins / kSmallThreads : 1;
    const int top = bins - static_cast<int>(threadIdx.x) * per_thread;  // exclusive upper bin
    int own = 0;
    if (top > 0)
      for (int b = top - 1; b >= top - per_thread; --b) own += static_cast<int>(histogram[b]);
    int above = 0;
    BlockScan(scan_storage).ExclusiveSum(own, above);
    if (top > 0 && above < need && above + own >= need) {
      int count = above;
      for (int b = top - 1; b >= top - per_thread; --b) {
        const int here = static_cast<int>(histogram[b]);
        if (count + here >= need) {
          found_digit = b;
          found_need = need - count;
          found_whole = here == need - count;
          break;
        }
        count += here;
      }
    }
    __syncthreads();
    prefix = level == 0 ? static_cast<uint32_t>(found_digit)
                        : ((prefix << bits) | static_cast<uint32_t>(found_digit));
    need = found_need;
    const bool whole = found_whole;
    __syncthreads();  // found_* and the histogram are reused by the next level
    if (whole) {      // every key of the threshold bin is taken: the lower digits decide nothing
      settled_shift = shift;
      break;
    }
  }

  if (threadIdx.x == 0) above_count = tie_count = 0;
  __syncthreads();
  const int above_total = taken - need;
  for (int position = threadIdx.x; position < visible; position += kSmallThreads) {
    const uint32_t key = keys[position] >> settled_shift;
    if (key > prefix) {
      out[atomicAdd(&above_count, 1)] = position_to_slot(row_pages, position);
    } else if (key == prefix) {
      const int tie = atomicAdd(&tie_count, 1);
      if (tie < need) out[above_total + tie] = position_to_slot(row_pages, position);
    }
  }
}

}  // namespace

namespace detail {

void launch_radix_topk(const TopkParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  if (params.max_visible <= kTopkSmallRow) {
    const int shared_bytes = std::max(1, params.max_visible) * 4;
    static const bool configured = [] {
      MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
          topk_small_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, kTopkSmallRow * 4));
      return true;
    }();
    (void)configured;
    launch_kernel(topk_small_rows, static_cast<unsigned>(params.rows), kSmallThreads, shared_bytes,
                  stream, params);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // Every row gets the same number of CTAs (the tickets count gridDim.x);
  // CTAs past a row's visible length only take their ticket.
  const unsigned chunks = static_cast<unsigned>(std::max<int64_t>(
      1, (static_cast<int64_t>(params.max_visible) + kTopkChunk - 1) / kTopkChunk));
  constexpr int kMaxGridY = 65535;
  for (int first = 0; first < params.rows; first += kMaxGridY) {
    TopkParams part = params;
    part.rows = std::min(kMaxGridY, params.rows - first);
    part.scores += static_cast<int64_t>(first) * params.score_stride;
    part.row_visible += first;
    if (part.row_request != nullptr) part.row_request += first;
    part.out_slots += static_cast<int64_t>(first) * params.top_k;
    part.histogram += static_cast<int64_t>(first) * kTopkHistogramBins;
    part.row_state += static_cast<int64_t>(first) * kTopkRowState;
    const dim3 grid(chunks, static_cast<unsigned>(part.rows));
    launch_kernel(topk_digit_pass<0>, grid, kThreads, 0, stream, part);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    launch_kernel(topk_digit_pass<1>, grid, kThreads, 0, stream, part);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    launch_kernel(topk_digit_pass<2>, grid, kThreads, 0, stream, part);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    launch_kernel(topk_collect, grid, kThreads, 0, stream, part);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace detail
}  // namespace megactx::cuda
