// Whether a pointer suits 16-byte vector loads (uint4 / float4, cp.async):
// what the kernels' launchers check before taking their vectorised paths.
#pragma once

#include <cstdint>

namespace megactx::cuda {

inline bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

}  // namespace megactx::cuda
