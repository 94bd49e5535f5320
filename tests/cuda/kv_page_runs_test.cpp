// The one-launch KV page-run copy (kernels/cuda/kv_copy/page_runs.h) between a
// device pool and a pinned host pool, both ways, against the bytes the host
// wrote: page-sized runs at scattered offsets, runs of several pages, an
// unaligned run (the cudaMemcpyAsync fallback), an empty run, two calls that
// reuse the staged run list, and more runs than a first call staged.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dsa_test_support.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/kv_copy/page_runs.h"

namespace megactx::test {
namespace {

struct Pinned {
  explicit Pinned(size_t bytes) : bytes(bytes) {
    MEGACTX_CUDA_CHECK(cudaHostAlloc(&data, bytes, cudaHostAllocDefault));
  }
  ~Pinned() { cudaFreeHost(data); }
  uint8_t* get() const { return static_cast<uint8_t*>(data); }
  void* data = nullptr;
  size_t bytes = 0;
};

TEST(KvPageRuns, OneLaunchCopiesEqualTheMemcpyCopies) {
  constexpr size_t kPage = 64 * 656;  // a latent page of 64 tokens
  constexpr size_t kPages = 40;
  std::mt19937 rng(3);
  std::vector<uint8_t> host_bytes(kPages * kPage), device_bytes(kPages * kPage);
  for (uint8_t& b : host_bytes) b = static_cast<uint8_t>(rng());
  for (uint8_t& b : device_bytes) b = static_cast<uint8_t>(rng());
  Pinned host(kPages * kPage);
  std::memcpy(host.get(), host_bytes.data(), host_bytes.size());
  DeviceBuffer<uint8_t> device(device_bytes);
  cudaStream_t stream;
  MEGACTX_CUDA_CHECK(cudaStreamCreate(&stream));
  cuda::PageRunCopier copier;

  // Host pages -> device pages (a prefix hit), then device -> host (an eviction).
  std::vector<cuda::CopyRun> load = {
      {host.get() + 3 * kPage, device.get() + 10 * kPage, kPage},
      {host.get() + 20 * kPage, device.get() + 0 * kPage, 3 * kPage},
      {host.get() + 7 * kPage + 5, device.get() + 30 * kPage + 5, 1000},  // unaligned
      {host.get() + 1 * kPage, device.get() + 1 * kPage, 0},
  };
  copier.copy(load, stream);
  std::vector<uint8_t> want_device = device_bytes;
  for (const cuda::CopyRun& run : load) {
    const size_t from = static_cast<const uint8_t*>(run.source) - host.get();
    const size_t to = static_cast<uint8_t*>(run.destination) - device.get();
    std::memcpy(want_device.data() + to, host_bytes.data() + from, static_cast<size_t>(run.bytes));
  }
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(device.download(), want_device);

  std::vector<cuda::CopyRun> save;
  for (size_t p = 0; p < 12; ++p)  // more runs than the first call staged
    save.push_back({device.get() + (2 * p + 1) * kPage, host.get() + (39 - p) * kPage, kPage});
  copier.copy(save, stream);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint8_t> want_host = host_bytes;
  for (const cuda::CopyRun& run : save) {
    const size_t from = static_cast<const uint8_t*>(run.source) - device.get();
    const size_t to = static_cast<uint8_t*>(run.destination) - host.get();
    std::memcpy(want_host.data() + to, want_device.data() + from, static_cast<size_t>(run.bytes));
  }
  EXPECT_EQ(std::memcmp(host.get(), want_host.data(), want_host.size()), 0);
  MEGACTX_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace megactx::test
