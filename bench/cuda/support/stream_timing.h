// The median time of a body of work launched on a stream, for benchmarks
// whose runs are long enough that CUDA Graphs add nothing.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace megactx::cuda {

// One untimed run (warm-up), then `reps` runs each timed by events; the
// median, in ms.
double stream_median_ms(cudaStream_t stream, const std::function<void()>& body, int reps);

}  // namespace megactx::cuda
