#include "bench/cuda/support/stream_timing.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

double stream_median_ms(cudaStream_t stream, const std::function<void()>& body, int reps) {
  cudaEvent_t start, stop;
  MEGACTX_CUDA_CHECK(cudaEventCreate(&start));
  MEGACTX_CUDA_CHECK(cudaEventCreate(&stop));
  body();
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    MEGACTX_CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    MEGACTX_CUDA_CHECK(cudaEventRecord(stop, stream));
    MEGACTX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MEGACTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  MEGACTX_CUDA_CHECK(cudaEventDestroy(start));
  MEGACTX_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace megactx::cuda
