// Device buffers for the CUDA benchmarks (freed by the caller with cudaFree):
// uninitialised, or zero-filled where the values do not matter to the timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

// `count` T's (at least one, so an empty shape still gets a valid pointer).
template <typename T>
T* device_alloc(size_t count) {
  T* pointer = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&pointer, std::max<size_t>(count, 1) * sizeof(T)));
  return pointer;
}

template <typename T>
T* device_zeros(size_t count) {
  T* pointer = device_alloc<T>(count);
  MEGACTX_CUDA_CHECK(cudaMemset(pointer, 0, std::max<size_t>(count, 1) * sizeof(T)));
  return pointer;
}

}  // namespace megactx::cuda
