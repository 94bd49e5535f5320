// The parts of an expert kernel's CTA that split k (each part a set of kWarps
// warps over the same weight rows, each a share of k): every part but the
// first stores its accumulators, and the first adds them in part order. The
// order is fixed, so the sum depends neither on timing nor on the tile's
// rows. Only for .cu files.
#pragma once

namespace megactx::cuda {

// partial: [kSplit - 1][kWarps][kGroups * 4][32] floats in shared memory
// (lanes consecutive: no bank conflicts). Every thread of the CTA must call
// it (it holds a CTA barrier); returns true in part 0, whose acc then holds
// the whole sums.
template <int kSplit, int kWarps, int kGroups>
__device__ __forceinline__ bool sum_split_parts(float (&acc)[kGroups][4], float* partial, int part,
                                                int warp, int lane) {
  auto at = [&](int p, int q, int e) {
    return ((((p - 1) * kWarps + warp) * kGroups + q) * 4 + e) * 32 + lane;
  };
  if (part > 0) {
#pragma unroll
    for (int q = 0; q < kGroups; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[at(part, q, e)] = acc[q][e];
  }
  __syncthreads();
  if (part > 0) return false;
  for (int p = 1; p < kSplit; ++p)
#pragma unroll
    for (int q = 0; q < kGroups; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][e] += partial[at(p, q, e)];
  return true;
}

}  // namespace megactx::cuda
