// The one-launch page-run copy of page_runs.h.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/kv_copy/page_runs.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread (PCIe latency)

// Block b copies runs b, b + gridDim.x, ...; the run list itself is read from
// pinned host memory.
__global__ void __launch_bounds__(kThreads) copy_runs_kernel(const CopyRun* runs, int count) {
  for (int r = blockIdx.x; r < count; r += gridDim.x) {
    const CopyRun run = runs[r];
    const uint4* from = static_cast<const uint4*>(run.source);
    uint4* to = static_cast<uint4*>(run.destination);
    const int64_t words = run.bytes / 16;
    for (int64_t base = threadIdx.x; base < words; base += int64_t{kThreads} * kUnroll) {
      uint4 value[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + int64_t{u} * kThreads;
        if (i < words) value[u] = from[i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + int64_t{u} * kThreads;
        if (i < words) to[i] = value[u];
      }
    }
  }
}

bool aligned(const CopyRun& run) {
  return (reinterpret_cast<uintptr_t>(run.source) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(run.destination) & 15u) == 0 && run.bytes % 16 == 0;
}

}  // namespace

PageRunCopier::~PageRunCopier() {
  if (done_ != nullptr) {
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
}

void PageRunCopier::copy(const std::vector<CopyRun>& runs, cudaStream_t stream) {
  if (runs.empty()) return;
  if (done_ == nullptr)
    MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  // The previous launch may still read the staged list.
  MEGACTX_CUDA_CHECK(cudaEventSynchronize(done_));
  if (runs.size() > capacity_) {
    if (staging_ != nullptr) MEGACTX_CUDA_CHECK(cudaFreeHost(staging_));
    staging_ = nullptr;
    capacity_ = 0;
    void* memory = nullptr;
    MEGACTX_CUDA_CHECK(cudaHostAlloc(&memory, runs.size() * sizeof(CopyRun), cudaHostAllocMapped));
    staging_ = static_cast<CopyRun*>(memory);
    capacity_ = runs.size();
  }
  int count = 0;
  for (const CopyRun& run : runs) {
    if (run.bytes <= 0) continue;
    if (aligned(run)) {
      staging_[count++] = run;
    } else {
      MEGACTX_CUDA_CHECK(cudaMemcpyAsync(
          run.destination, run.source, static_cast<size_t>(run.bytes), cudaMemcpyDefault, stream));
    }
  }
  if (count > 0) {
    CopyRun* list = nullptr;
    MEGACTX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&list), staging_, 0));
    const int blocks = count < 1024 ? count : 1024;
    copy_runs_kernel<<<blocks, kThreads, 0, stream>>>(list, count);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
  }
  MEGACTX_CUDA_CHECK(cudaEventRecord(done_, stream));
}

}  // namespace megactx::cuda
