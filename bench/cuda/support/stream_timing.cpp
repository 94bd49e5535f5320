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

double cycled_median_us(cudaStream_t stream, int copies, int calls,
                        const std::function<void(int)>& body) {
  cudaEvent_t start, stop;
  MEGACTX_CUDA_CHECK(cudaEventCreate(&start));
  MEGACTX_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < copies; ++i) body(i);  // warm-up
  std::vector<double> times;
  for (int round = 0; round < 5; ++round) {
    MEGACTX_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) body(i % copies);
    MEGACTX_CUDA_CHECK(cudaEventRecord(stop, stream));
    MEGACTX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    MEGACTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1000.0 * ms / calls);
  }
  std::sort(times.begin(), times.end());
  MEGACTX_CUDA_CHECK(cudaEventDestroy(start));
  MEGACTX_CUDA_CHECK(cudaEventDestroy(stop));
  return times[times.size() / 2];
}

}  // namespace megactx::cuda
