#include "cache/page_allocator.h"

#include "core/error.h"

namespace megactx {

PageAllocator::PageAllocator(int64_t num_pages, int64_t offload_pages, int ranks) {
  MEGACTX_CHECK(num_pages >= 0 && offload_pages >= 0 && num_pages + offload_pages <= INT32_MAX,
                "invalid KV page counts {} + {}", num_pages, offload_pages);
  MEGACTX_CHECK(ranks >= 1 && num_pages % ranks == 0 && offload_pages % ranks == 0,
                "KV pages: {} device and {} offload pages do not split over {} data-parallel "
                "ranks",
                num_pages, offload_pages, ranks);
  layout_ = {num_pages / ranks, offload_pages / ranks, ranks};
  ref_counts_.assign(static_cast<size_t>(num_pages + offload_pages), 0);
  free_pages_.assign(static_cast<size_t>(ranks), {});
  free_offload_pages_.assign(static_cast<size_t>(ranks), {});
  // Highest first: the lowest ids come out first.
  const auto fill = [](std::vector<int32_t>& list, int64_t first, int64_t count) {
    list.reserve(static_cast<size_t>(count));
    for (int64_t page = first + count - 1; page >= first; --page)
      list.push_back(static_cast<int32_t>(page));
  };
  for (int rank = 0; rank < ranks; ++rank) {
    fill(free_pages_[static_cast<size_t>(rank)], rank * layout_.device_per_rank,
         layout_.device_per_rank);
    fill(free_offload_pages_[static_cast<size_t>(rank)],
         num_pages + rank * layout_.offload_per_rank, layout_.offload_per_rank);
  }
}

namespace {

std::optional<int32_t> take(std::vector<int32_t>& free_list, std::vector<int32_t>& ref_counts) {
  if (free_list.empty()) return std::nullopt;
  const int32_t page = free_list.back();
  free_list.pop_back();
  ref_counts[static_cast<size_t>(page)] = 1;
  return page;
}

}  // namespace

int64_t PageAllocator::num_free() const {
  int64_t free = 0;
  for (const std::vector<int32_t>& list : free_pages_) free += static_cast<int64_t>(list.size());
  return free;
}

std::optional<int32_t> PageAllocator::allocate(int rank) {
  MEGACTX_CHECK(rank >= 0 && rank < ranks(), "KV pages of rank {} of {}", rank, ranks());
  return take(free_pages_[static_cast<size_t>(rank)], ref_counts_);
}

int64_t PageAllocator::num_free_offload() const {
  int64_t free = 0;
  for (const std::vector<int32_t>& list : free_offload_pages_)
    free += static_cast<int64_t>(list.size());
  return free;
}

std::optional<int32_t> PageAllocator::allocate_offload(int rank) {
  MEGACTX_CHECK(rank >= 0 && rank < ranks(), "offload pages of rank {} of {}", rank, ranks());
  return take(free_offload_pages_[static_cast<size_t>(rank)], ref_counts_);
}

void PageAllocator::check_page(int32_t page) const {
  MEGACTX_CHECK(page >= 0 && page < num_pages(), "KV page {} out of range [0, {})", page,
                num_pages());
}

void PageAllocator::add_ref(int32_t page) {
  check_page(page);
  int32_t& count = ref_counts_[static_cast<size_t>(page)];
  MEGACTX_CHECK(count > 0, "add_ref on free KV page {}", page);
  ++count;
}

void PageAllocator::release(int32_t page) {
  check_page(page);
  int32_t& count = ref_counts_[static_cast<size_t>(page)];
  MEGACTX_CHECK(count > 0, "release of free KV page {}", page);
  if (--count == 0)
    (is_offload(page) ? free_offload_pages_ : free_pages_)[static_cast<size_t>(rank_of(page))]
        .push_back(page);
}

int32_t PageAllocator::ref_count(int32_t page) const {
  check_page(page);
  return ref_counts_[static_cast<size_t>(page)];
}

void PageAllocator::check_integrity(const std::vector<int32_t>& expected) const {
  MEGACTX_CHECK(expected.size() == ref_counts_.size(), "integrity: {} expected counts for {} pages",
                expected.size(), ref_counts_.size());
  for (size_t page = 0; page < ref_counts_.size(); ++page) {
    MEGACTX_CHECK(ref_counts_[page] == expected[page],
                  "integrity: KV page {} has reference count {} but {} holders", page,
                  ref_counts_[page], expected[page]);
  }
  std::vector<char> seen(ref_counts_.size(), 0);
  for (const bool offload : {false, true}) {
    for (int rank = 0; rank < ranks(); ++rank) {
      const std::vector<int32_t>& list =
          (offload ? free_offload_pages_ : free_pages_)[static_cast<size_t>(rank)];
      for (const int32_t page : list) {
        check_page(page);
        MEGACTX_CHECK(is_offload(page) == offload && rank_of(page) == rank,
                      "integrity: KV page {} on another kind's or rank's free list", page);
        MEGACTX_CHECK(!seen[static_cast<size_t>(page)],
                      "integrity: KV page {} twice on the free list", page);
        seen[static_cast<size_t>(page)] = 1;
        MEGACTX_CHECK(ref_counts_[static_cast<size_t>(page)] == 0,
                      "integrity: KV page {} is both free and used", page);
      }
    }
  }
  for (size_t page = 0; page < ref_counts_.size(); ++page) {
    MEGACTX_CHECK(ref_counts_[page] > 0 || seen[page],
                  "integrity: KV page {} is lost (count 0, not free)", page);
  }
}

}  // namespace megactx
