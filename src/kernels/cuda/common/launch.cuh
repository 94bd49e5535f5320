// Kernel launches with programmatic dependent launch (PDL, sm_90): a kernel
// launched by launch_kernel may be scheduled while the kernel before it in
// the stream is still running, so that its launch latency (~1-3 us per kernel
// in a CUDA Graph, the largest cost of a small-batch decode step of many
// small kernels) overlaps the predecessor's work.
//
// The contract: every kernel launched by launch_kernel starts with
// grid_dependency_wait() before any memory access (it returns once the
// predecessor grid has completed and its writes are visible; a no-op when
// the kernel was launched without PDL), then grid_dependency_trigger() (this
// grid's own successor may now be scheduled; it too waits before touching
// memory). Kernels launched with <<<>>> or by libraries keep the ordinary
// stream order. Only for .cu files (sm_90a).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"

namespace megactx::cuda {

__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void grid_dependency_trigger() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic_launch()) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  MEGACTX_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The configuration of a launch of `grid` CTAs in thread-block clusters of
// `cluster_size` CTAs along x, with PDL where launch_kernel would use it (the
// kernel keeps launch_kernel's contract). config.attrs points into
// `attributes`, which must outlive the launch.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, size_t shared_bytes,
                                                cudaStream_t stream, unsigned cluster_size,
                                                cudaLaunchAttribute (&attributes)[2]) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = cluster_size;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = programmatic_launch() ? 2 : 1;
  return config;
}

// Blocks of `threads` threads for a grid-stride loop over `count` items: one
// item per thread up to 65535 x 16 blocks (the loop covers the rest), at
// least one block.
inline int grid_stride_blocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace megactx::cuda
