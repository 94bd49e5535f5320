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

}  // namespace megactx::cuda
