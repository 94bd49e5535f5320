// Warp-collective counting for the radix selections (radix_topk.cu,
// cluster_topk.cu, indexer_topk/decode_select.cu): a histogram add and an
// output claim with one shared-memory atomic per warp where the lanes agree.
// Every lane of the warp must call them. Only for .cu files.
#pragma once

#include <cstdint>

namespace megactx::cuda {

// One count per candidate lane into histogram[digit]: the lanes whose digit
// equals the first candidate lane's add together (one atomic), the others
// one each. A level's candidates crowd into few bins (the top digits of
// similar scores are nearly always the same), where per-lane atomics on one
// address serialise. (__match_any_sync groups every digit, but was measured
// slower than the plain atomics it saves: docs/benchmarks.md.)
__device__ __forceinline__ void warp_count_digit(uint32_t* histogram, bool candidate,
                                                 uint32_t digit) {
  const unsigned candidates = __ballot_sync(0xffffffffu, candidate);
  if (candidates == 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int leader = __ffs(candidates) - 1;
  const uint32_t leader_digit = __shfl_sync(0xffffffffu, digit, leader);
  const bool with_leader = candidate && digit == leader_digit;
  const unsigned together = __ballot_sync(0xffffffffu, with_leader);
  if (lane == leader) atomicAdd(&histogram[leader_digit], static_cast<uint32_t>(__popc(together)));
  if (candidate && !with_leader) atomicAdd(&histogram[digit], 1u);
}

// Index of this lane's item among the lanes of its warp whose `take` is set,
// counted on from *counter (shared or distributed shared memory): one atomic
// per warp. Meaningful where take is set.
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

}  // namespace megactx::cuda
