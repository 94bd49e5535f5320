#pragma once

#include <cstddef>
#include <string>

namespace megactx::cuda {

struct DeviceInfo {
  std::string name;
  int compute_capability;  // e.g. 90 for the H200
  int multiprocessors;
  size_t free_bytes;
  size_t total_bytes;
};

DeviceInfo query_device(int ordinal);
int device_count();  // 0 when there is no driver or no GPU
// The current device's SM count, read once per process (kernels size their
// grids by it; a process drives one GPU).
int current_device_multiprocessors();

}  // namespace megactx::cuda
