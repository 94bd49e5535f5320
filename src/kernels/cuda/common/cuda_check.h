// Every CUDA runtime and cuBLAS call is checked; a failure becomes a
// megactx::Error naming the call site and the error string. This header is
// safe to include from .cu files (it does not pull in fmt).
#pragma once

#include <cuda_runtime.h>

namespace megactx::cuda {
[[noreturn]] void throw_cuda_error(int status, const char* status_text, const char* file, int line);
}  // namespace megactx::cuda

#define MEGACTX_CUDA_CHECK(call)                                                             \
  do {                                                                                       \
    cudaError_t status_ = (call);                                                            \
    if (status_ != cudaSuccess)                                                              \
      ::megactx::cuda::throw_cuda_error(static_cast<int>(status_), cudaGetErrorString(status_), \
                                        __FILE__, __LINE__);                                 \
  } while (0)
