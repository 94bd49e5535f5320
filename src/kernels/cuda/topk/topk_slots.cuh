// What a top-k selection writes for a chosen position, shared by the
// selection kernels (radix_topk.cu, cluster_topk.cu). Only for .cu files.
#pragma once

#include <cstdint>

#include "kernels/cuda/topk/topk.h"

namespace megactx::cuda {

// The physical slot of `position` through a row's block table, or the
// position itself in positions mode (table null).
__device__ __forceinline__ int32_t position_to_slot(const int32_t* table, int64_t position) {
  if (table == nullptr) return static_cast<int32_t>(position);
  return table[position / kPageTokens] * kPageTokens + static_cast<int32_t>(position % kPageTokens);
}

// Row `row`'s block table, or null in positions mode (row_request unused then).
__device__ __forceinline__ const int32_t* row_table(const TopkParams& p, int row) {
  if (p.block_table == nullptr) return nullptr;
  return p.block_table + static_cast<int64_t>(p.row_request[row]) * p.block_table_stride;
}

}  // namespace megactx::cuda
