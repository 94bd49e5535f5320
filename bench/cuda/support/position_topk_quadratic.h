// The former top-k of the fp32 fallback indexer: each position ranked
// against every other, one CTA per row, O(visible^2); the contract of
// position_topk (kernels/cuda/dsa_fallback/position_topk.h). Kept out of the engine
// for the fallback top-k benchmark and as a second reference of its GPU test.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/dsa_fallback/position_topk.h"

namespace megactx::cuda {

// Validates (megactx::Error; topk <= 8192) and launches on `stream`.
void position_topk_quadratic(const PositionTopkParams& params, cudaStream_t stream);

namespace detail {
void launch_position_topk_quadratic(const PositionTopkParams& params, cudaStream_t stream);
}  // namespace detail

}  // namespace megactx::cuda
