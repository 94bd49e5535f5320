// The median time of a body of work launched on a stream, for benchmarks
// whose runs are long enough that CUDA Graphs add nothing.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace megactx::cuda {

// One untimed run (warm-up), then `reps` runs each timed by events; the
// median, in ms.
double stream_median_ms(cudaStream_t stream, const std::function<void()>& body, int reps);

// Median us per call of body(copy) over 5 rounds of `calls` calls cycling
// through `copies` (after one untimed pass over them): the per-call time of
// a kernel whose weights come from HBM, as in a decode step, when the copies
// together exceed L2.
double cycled_median_us(cudaStream_t stream, int copies, int calls,
                        const std::function<void(int)>& body);

}  // namespace megactx::cuda
