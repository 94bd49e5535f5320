// Radix select + ordered collect of the fallback indexer's top-k; see
// position_topk.h for the contract and the algorithm.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/dsa_fallback/position_topk.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kItems = static_cast<int>(kPositionTopkTile) / kThreads;  // consecutive positions
constexpr int kUnroll = 8;      // independent loads in flight per thread when streaming a row
constexpr int kMaxBins = 2048;  // digits of 11, 11 and 10 bits
static_assert(kItems == 4, "the collect reads each thread's keys as one uint4");
static_assert(kMaxBins / 2 % kThreads == 0, "every thread owns whole bins of every digit");

// Monotone map float -> uint32 (a > b <=> key(a) > key(b)) with -0.0 folded
// onto +0.0, so that floats that compare equal get equal keys (the tie rule).
__device__ __forceinline__ uint32_t ordered_key(float value) {
  uint32_t bits = __float_as_uint(value);
  if (bits == 0x80000000u) bits = 0u;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Calls f(position, key) for every position < n of `row` (any order): float4
// loads when the row is 16-byte aligned, kUnroll loads per thread in flight
// so that one CTA streaming from L2 is not latency bound.
template <typename F>
__device__ __forceinline__ void for_each_key(const float* row, int64_t n, F&& f) {
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = n / 4;
    for (int64_t base = threadIdx.x; base < n4; base += int64_t{kThreads} * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + int64_t{u} * kThreads;
        v[u] = i < n4 ? row4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + int64_t{u} * kThreads;
        if (i < n4) {
          f(4 * i, ordered_key(v[u].x));
          f(4 * i + 1, ordered_key(v[u].y));
          f(4 * i + 2, ordered_key(v[u].z));
          f(4 * i + 3, ordered_key(v[u].w));
        }
      }
    }
    done = n4 * 4;
  }
  for (int64_t base = done + threadIdx.x; base < n; base += int64_t{kThreads} * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kThreads;
      v[u] = i < n ? row[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kThreads;
      if (i < n) f(i, ordered_key(v[u]));
    }
  }
}

struct SharedState {
  uint32_t histogram[kMaxBins];
  union {
    cub::BlockScan<uint32_t, kThreads>::TempStorage bins;
    cub::BlockScan<unsigned long long, kThreads>::TempStorage positions;
  } scan;
  uint32_t found_bin, found_above, found_here;
};

// One CTA per row. KeysInShared: dynamic shared memory holds the row's keys
// ([round_up(max_context, 4)] uint32), filled by the first digit pass; else
// it is a staging tile ([kPositionTopkTile] uint32) and every pass reads the
// scores again.
template <bool KeysInShared>
__global__ void __launch_bounds__(kThreads) position_topk_kernel(PositionTopkParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint4 dynamic_shared[];
  uint32_t* keys = reinterpret_cast<uint32_t*>(dynamic_shared);
  __shared__ SharedState sh;

  const int64_t t = blockIdx.x;
  const int64_t last = p.positions[t];
  const int64_t visible = last < 0 ? 0 : (last + 1 < p.max_context ? last + 1 : p.max_context);
  int32_t* out = p.indices + t * p.topk;
  if (visible <= p.topk) {  // every visible position is taken, in order
    for (int64_t i = threadIdx.x; i < p.topk; i += kThreads)
      out[i] = i < visible ? static_cast<int32_t>(i) : -1;
    if (threadIdx.x == 0) p.counts[t] = static_cast<int32_t>(visible);
    return;
  }
  const float* row = p.scores + t * p.score_stride;

  // ---- Radix select: the threshold prefix (the key's bits >= shift) of the
  // k-th largest key, and `need`, how many keys with that prefix are taken.
  // Every key whose prefix is above it is taken.
  uint32_t prefix = 0;
  int shift = 32;
  uint32_t need = static_cast<uint32_t>(p.topk);  // < visible <= 2^31
#pragma unroll 1
  for (int level = 0; level < 3; ++level) {
    const int bits = level < 2 ? 11 : 10;
    const int bins = 1 << bits;
    const int next = shift - bits;
    for (int i = threadIdx.x; i < bins; i += kThreads) sh.histogram[i] = 0;
    __syncthreads();
    // level 0 counts every key; later levels only those with the prefix so far.
    auto count = [&](int64_t, uint32_t key) {
      if (level == 0 || (key >> shift) == prefix)
        atomicAdd(&sh.histogram[(key >> next) & (bins - 1)], 1u);
    };
    if (KeysInShared && level == 0) {
      for_each_key(row, visible, [&](int64_t position, uint32_t key) {
        keys[position] = key;
        count(position, key);
      });
    } else if (KeysInShared) {
      for (int64_t i = threadIdx.x; i < visible; i += kThreads) count(i, keys[i]);
    } else {
      for_each_key(row, visible, count);
    }
    __syncthreads();
    // Thread i owns bins [top - per, top), top = bins - i * per: the scan of
    // their counts from the top bin down finds where the need-th key lies.
    const int per = bins / kThreads;
    const int top = bins - static_cast<int>(threadIdx.x) * per;
    uint32_t own = 0;
    for (int b = top - 1; b >= top - per; --b) own += sh.histogram[b];
    uint32_t above = 0;
    cub::BlockScan<uint32_t, kThreads>(sh.scan.bins).ExclusiveSum(own, above);
    if (above < need && above + own >= need) {  // exactly one thread
      uint32_t so_far = above;
      for (int b = top - 1; b >= top - per; --b) {
        const uint32_t here = sh.histogram[b];
        if (so_far + here >= need) {
          sh.found_bin = static_cast<uint32_t>(b);
          sh.found_above = so_far;
          sh.found_here = here;
          break;
        }
        so_far += here;
      }
    }
    __syncthreads();
    prefix = (prefix << bits) | sh.found_bin;  // prefix is 0 at level 0
    need -= sh.found_above;
    shift = next;
    const bool whole_bin = need == sh.found_here;  // every key of the bin is taken
    __syncthreads();                               // sh.found_* and the scan storage are reused
    if (whole_bin) break;
  }

  // ---- Ordered collect: tiles of kPositionTopkTile positions, kItems
  // consecutive ones per thread; an exclusive scan of the packed counts
  // (above << 32 | equal) in position order gives each taken position its
  // output slot: above_before + min(equal_before, need).
  unsigned long long carry = 0;  // counts of the tiles before
#pragma unroll 1
  for (int64_t tile = 0; tile < visible; tile += kPositionTopkTile) {
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kItems;
    uint4 four = make_uint4(0, 0, 0, 0);
    if constexpr (KeysInShared) {
      if (first < visible) four = *reinterpret_cast<const uint4*>(keys + first);
    } else {
      const int64_t n = visible - tile < kPositionTopkTile ? visible - tile : kPositionTopkTile;
      float staged[kItems];  // kItems independent loads in flight, coalesced across the CTA
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int64_t i = threadIdx.x + int64_t{j} * kThreads;
        staged[j] = i < n ? row[tile + i] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int64_t i = threadIdx.x + int64_t{j} * kThreads;
        if (i < n) keys[i] = ordered_key(staged[j]);
      }
      __syncthreads();
      if (first < visible) four = *reinterpret_cast<const uint4*>(keys + threadIdx.x * kItems);
    }
    const uint32_t key[kItems] = {four.x, four.y, four.z, four.w};
    bool is_above[kItems], is_equal[kItems];
    unsigned long long mine = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool valid = first + j < visible;
      const uint32_t high = shift == 32 ? 0u : key[j] >> shift;  // shift < 32 after level 0
      is_above[j] = valid && high > prefix;
      is_equal[j] = valid && high == prefix;
      mine += is_above[j] ? (1ull << 32) : (is_equal[j] ? 1ull : 0ull);
    }
    unsigned long long before = 0, total = 0;
    cub::BlockScan<unsigned long long, kThreads>(sh.scan.positions)
        .ExclusiveSum(mine, before, total);
    before += carry;
    uint32_t above_before = static_cast<uint32_t>(before >> 32);
    uint32_t equal_before = static_cast<uint32_t>(before & 0xffffffffu);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int32_t position = static_cast<int32_t>(first + j);
      if (is_above[j]) {
        out[above_before + (equal_before < need ? equal_before : need)] = position;
        ++above_before;
      } else if (is_equal[j]) {
        if (equal_before < need) out[above_before + equal_before] = position;
        ++equal_before;
      }
    }
    carry += total;
    const uint32_t equal_taken = static_cast<uint32_t>(carry & 0xffffffffu);
    const int64_t taken =
        static_cast<int64_t>(carry >> 32) + (equal_taken < need ? equal_taken : need);
    __syncthreads();             // the scan storage and the staging tile are reused
    if (taken >= p.topk) break;  // uniform: carry is the same in every thread
  }
  if (threadIdx.x == 0) p.counts[t] = static_cast<int32_t>(p.topk);
}

}  // namespace

namespace detail {

void launch_position_topk(const PositionTopkParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  const PositionTopkPlan plan = plan_position_topk(params.max_context);
  const size_t shared = static_cast<size_t>(plan.shared_bytes);
  const unsigned grid = static_cast<unsigned>(params.rows);
  if (plan.keys_in_shared) {
    // Once, before any capture needs it: the opt-in above 48 KiB.
    static const bool configured = [] {
      MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(position_topk_kernel<true>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(kPositionTopkSharedRow * 4)));
      return true;
    }();
    (void)configured;
    launch_kernel(position_topk_kernel<true>, grid, kThreads, shared, stream, params);
  } else {
    launch_kernel(position_topk_kernel<false>, grid, kThreads, shared, stream, params);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
