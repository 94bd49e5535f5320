// HostKvTier: the second level of the prefix cache. When the device pool runs
// short, the prefix cache evicts its least recently used pages; with a host
// tier their KV bytes (every latent and indexer-key pool of the page) are
// first copied into a pool of host memory, and a later request whose prefix
// they hold gets them copied back instead of recomputing them -- what
// SGLang's hierarchical cache and vLLM's CPU offload do.
//
// Preempted requests leave their full pages in the prefix cache, so under
// memory pressure their KV moves to the host and returns when they are
// admitted again: swap-out preemption at page granularity, with only the last
// partial page recomputed.
//
// Copies go through a KvPageCopy: a host memcpy for host pools (the CPU
// model), or the CUDA backend's asynchronous copies on the model's stream
// (make_cuda_kv_page_copy), which order a device page's save before the next
// forward that reuses the page and its load before the forward that reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "cache/kv_cache.h"
#include "cache/page_allocator.h"

namespace megactx {

// Copies pages `from_pages[i]` of `from` to `to_pages[i]` of `to`, every pool.
// The two caches have the same layout (dtype, dims, layers, page size).
using KvPageCopy = std::function<void(const PagedKvCache& from, std::span<const int32_t> from_pages,
                                      PagedKvCache& to, std::span<const int32_t> to_pages)>;

// Checks the copy (check_kv_page_copy) and calls `copy` once per pool and run
// of pages consecutive on both sides, with the run's byte addresses in the
// two caches' pools (host or device pointers, as the pools are).
void for_each_page_run(
    const PagedKvCache& from, std::span<const int32_t> from_pages, PagedKvCache& to,
    std::span<const int32_t> to_pages,
    const std::function<void(const std::byte* source, std::byte* destination, size_t bytes)>& copy);

// The KvPageCopy of host pools: memcpy, one per pool and run of consecutive pages.
void copy_kv_pages_on_host(const PagedKvCache& from, std::span<const int32_t> from_pages,
                           PagedKvCache& to, std::span<const int32_t> to_pages);

// Throws megactx::Error unless `a` and `b` hold the same per-page layout and
// the page lists are equally long and inside both caches.
void check_kv_page_copy(const PagedKvCache& from, std::span<const int32_t> from_pages,
                        const PagedKvCache& to, std::span<const int32_t> to_pages);

class HostKvTier {
 public:
  // `host` holds the tier's pages (host memory; pinned for a CUDA model) in
  // `device`'s layout. `device` must outlive the tier. Data-parallel
  // attention (`ranks` > 1): `device` and `host` are rank 0's shares, every
  // rank's tier holds as many pages, numbered in one space with a range per
  // rank (page_allocator.h), and `copy` takes pages in that numbering.
  HostKvTier(PagedKvCache& device, std::unique_ptr<PagedKvCache> host,
             KvPageCopy copy = copy_kv_pages_on_host, int ranks = 1);

  PageAllocator& allocator() { return allocator_; }
  const PageAllocator& allocator() const { return allocator_; }
  int64_t num_pages() const { return allocator_.num_pages(); }
  const PagedKvCache& host_cache() const { return *host_; }

  // Device pages -> host pages (an evicted page's write-back).
  void save(std::span<const int32_t> device_pages, std::span<const int32_t> host_pages);
  // Host pages -> device pages (a prefix hit on the host).
  void load(std::span<const int32_t> host_pages, std::span<const int32_t> device_pages);

  int64_t saved_pages() const { return saved_pages_; }
  int64_t loaded_pages() const { return loaded_pages_; }

 private:
  PagedKvCache& device_;
  std::unique_ptr<PagedKvCache> host_;
  PageAllocator allocator_;
  KvPageCopy copy_;
  int64_t saved_pages_ = 0;
  int64_t loaded_pages_ = 0;
};

}  // namespace megactx
