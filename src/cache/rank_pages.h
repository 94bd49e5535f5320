// RankPages: how data-parallel attention numbers every rank's KV pages in one
// space (the scheduler's and the page allocator's, on rank 0), and how a
// global page id maps to the rank that holds it and its id in that rank's
// own cache.
//
// Global ids: the device pages first, rank r's [r * D, (r + 1) * D); then
// the live host tier's offload pages, rank r's [R * D + r * O, R * D + (r +
// 1) * O) (D device and O offload pages per rank, R ranks). Each rank's
// cache numbers its own pages as one process's does (kv_cache.h): device
// pages [0, D), offload pages [D, D + O). Keeping every device page below
// every offload page keeps PagedKvCache's and PageAllocator's one test
// (page >= device pages) for "offload page" true in the global numbering
// too. With one rank the global and local ids are the same.
#pragma once

#include <cstdint>

namespace megactx {

struct RankPages {
  int64_t device_per_rank = 0;
  int64_t offload_per_rank = 0;
  int ranks = 1;

  int64_t device_pages() const { return device_per_rank * ranks; }
  int64_t total() const { return (device_per_rank + offload_per_rank) * ranks; }
  bool contains(int64_t page) const { return page >= 0 && page < total(); }
  bool is_offload(int64_t page) const { return page >= device_pages(); }
  // The rank holding `page` (contains(page) is the caller's to check).
  int rank_of(int64_t page) const {
    return static_cast<int>(is_offload(page) ? (page - device_pages()) / offload_per_rank
                                             : page / device_per_rank);
  }
  // `page`'s id in its rank's cache.
  int32_t local(int64_t page) const {
    return static_cast<int32_t>(is_offload(page)
                                    ? device_per_rank + (page - device_pages()) % offload_per_rank
                                    : page % device_per_rank);
  }
};

}  // namespace megactx
