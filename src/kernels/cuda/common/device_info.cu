// Device discovery for the CUDA backend.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"

namespace megactx::cuda {

DeviceInfo query_device(int ordinal) {
  cudaDeviceProp properties{};
  MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&properties, ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  MEGACTX_CUDA_CHECK(cudaSetDevice(ordinal));
  MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DeviceInfo{properties.name, properties.major * 10 + properties.minor,
                    properties.multiProcessorCount, free_bytes, total_bytes};
}

int current_device_multiprocessors() {
  static const int count = [] {
    int device = 0, value = 0;
    MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
    MEGACTX_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
    return value;
  }();
  return count;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

}  // namespace megactx::cuda
