// Small helpers of the GPU tests in this folder: host vectors to and from
// device memory, seeded uniform random values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "model/cuda/device_buffer.h"

namespace megactx::cuda::device_test {

// `values` into `buffer` (grown as needed); returns the device pointer.
template <typename T>
T* to_device(DeviceBuffer& buffer, const std::vector<T>& values) {
  T* data = buffer.get<T>(static_cast<int64_t>(values.size()));
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(data, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  return data;
}

// `count` elements at device `data`, copied back.
template <typename T>
std::vector<T> to_host(const T* data, int64_t count) {
  std::vector<T> values(static_cast<size_t>(count));
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(values.data(), data, values.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return values;
}

// `count` values uniform in [-scale, scale) from `seed`.
inline std::vector<float> random_values(int64_t count, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = uniform(rng);
  return values;
}

}  // namespace megactx::cuda::device_test
