// KV page runs copied between device pools and pinned host pools in one
// launch (the host KV tier's saves and loads): a kernel reads and writes the
// pinned pages directly through unified addressing, instead of one
// cudaMemcpyAsync per pool and run of pages, whose per-call cost held a
// prefix hit of 16K tokens from host memory to 5.8 GB/s (a contiguous pinned
// copy runs at ~54 GB/s on the H200).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megactx::cuda {

// Whether the host KV tier's page copies (make_cuda_kv_page_copy) take this
// one-launch path (KvPageRuns.OneLaunchCopiesEqualTheMemcpyCopies): on the
// H200, 12 pools x 256 scattered pages load at 46.2 GB/s, 86% of one
// contiguous pinned copy (53.6 GB/s), where a cudaMemcpyAsync per pool and run
// reached 5.8 GB/s (host_tier_bench).
inline constexpr bool kKvPageCopyKernel = true;

// One run: `bytes` from `source` to `destination` (device or pinned host
// addresses, 16-byte aligned, bytes a multiple of 16).
struct CopyRun {
  const void* source = nullptr;
  void* destination = nullptr;
  int64_t bytes = 0;
};

// Copies every run in one kernel launch on `stream`. The run list is staged
// in pinned memory owned by `staging` (grow-only, reused: a call waits for
// the previous call's kernel before it rewrites the list). Runs that are not
// 16-byte aligned go through cudaMemcpyAsync instead.
class PageRunCopier {
 public:
  PageRunCopier() = default;
  ~PageRunCopier();
  PageRunCopier(const PageRunCopier&) = delete;
  PageRunCopier& operator=(const PageRunCopier&) = delete;

  void copy(const std::vector<CopyRun>& runs, cudaStream_t stream);

 private:
  CopyRun* staging_ = nullptr;  // pinned host memory, read by the kernel
  size_t capacity_ = 0;         // runs it holds
  cudaEvent_t done_ = nullptr;  // the last launch that read staging_
};

}  // namespace megactx::cuda
