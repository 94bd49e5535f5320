// PageAllocator: hands out KV pages (64-token units shared by every pool, so
// one page id covers the latent and the indexer caches of all layers) and
// counts who holds each page. Holders are requests (their page tables) and the
// prefix cache (one reference per tree node); a page returns to the free list
// when its last holder releases it.
//
// With the live host tier, ids [device_pages, device_pages + offload_pages)
// are offload pages (latents in host memory, kv_cache.h), handed out by
// allocate_offload() from their own free lists.
//
// Data-parallel attention (`ranks` > 1): the device pages are `ranks` equal
// ranges, range r [r * pages_per_rank, (r + 1) * pages_per_rank) held by
// rank r's KV pools, and so are the offload pages after them (numbered as
// cache/rank_pages.h says); allocate(r) and allocate_offload(r) hand out
// pages of rank r only, since a sequence's rows run on the rank that holds
// all its pages.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cache/rank_pages.h"

namespace megactx {

class PageAllocator {
 public:
  // `ranks` must divide num_pages and offload_pages.
  explicit PageAllocator(int64_t num_pages, int64_t offload_pages = 0, int ranks = 1);

  // Every page id, device and offload.
  int64_t num_pages() const { return static_cast<int64_t>(ref_counts_.size()); }
  // Device pages: what num_free / num_used / allocate count and give.
  int64_t device_pages() const { return layout_.device_pages(); }
  int64_t num_free() const;
  int64_t num_used() const { return device_pages() - num_free(); }
  // Data-parallel ranks, each pages_per_rank() device pages.
  int ranks() const { return layout_.ranks; }
  int64_t pages_per_rank() const { return layout_.device_per_rank; }
  // The numbering of every rank's pages (one rank: ids as the cache's).
  const RankPages& layout() const { return layout_; }
  // The rank holding `page`, device or offload.
  int rank_of(int32_t page) const { return layout_.rank_of(page); }
  int64_t num_free(int rank) const {
    return static_cast<int64_t>(free_pages_[static_cast<size_t>(rank)].size());
  }
  // Offload pages: of every rank, then per rank.
  int64_t offload_pages() const { return num_pages() - device_pages(); }
  int64_t num_free_offload() const;
  int64_t num_used_offload() const { return offload_pages() - num_free_offload(); }
  int64_t offload_pages_per_rank() const { return layout_.offload_per_rank; }
  int64_t num_free_offload(int rank) const {
    return static_cast<int64_t>(free_offload_pages_[static_cast<size_t>(rank)].size());
  }
  int64_t num_used_offload(int rank) const {
    return offload_pages_per_rank() - num_free_offload(rank);
  }
  bool is_offload(int32_t page) const { return page >= device_pages(); }

  // A free device page of `rank` with reference count 1, or nothing when
  // none is free.
  std::optional<int32_t> allocate(int rank = 0);
  // The same for an offload page of `rank`.
  std::optional<int32_t> allocate_offload(int rank = 0);
  void add_ref(int32_t page);
  // Drops one reference; the page is free again at zero.
  void release(int32_t page);
  int32_t ref_count(int32_t page) const;

  // Throws megactx::Error unless every page's count equals `expected[page]`
  // and the free list holds exactly the pages with count 0, each once.
  void check_integrity(const std::vector<int32_t>& expected) const;

 private:
  void check_page(int32_t page) const;

  std::vector<int32_t> ref_counts_;  // [num_pages]
  // [ranks] stacks; the lowest ids come out first.
  std::vector<std::vector<int32_t>> free_pages_;
  std::vector<std::vector<int32_t>> free_offload_pages_;  // the same for offload pages
  RankPages layout_;
};

}  // namespace megactx
