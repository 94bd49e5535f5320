#include "cache/page_allocator.h"

#include "core/error.h"

namespace megactx {

PageAllocator::PageAllocator(int64_t num_pages, int64_t offload_pages, int ranks)
    : device_pages_(num_pages) {
  MEGACTX_CHECK(num_pages >= 0 && offload_pages >= 0 && num_pages + offload_pages <= INT32_MAX,
                "invalid KV page counts {} + {}", num_pages, offload_pages);
  MEGACTX_CHECK(ranks >= 1 && num_pages % ranks == 0 && (ranks == 1 || offload_pages == 0),
                "KV pages: {} device pages over {} data-parallel ranks ({} offload pages)",
                num_pages, ranks, offload_pages);
  ref_counts_.assign(static_cast<size_t>(num_pages + offload_pages), 0);
  free_pages_.assign(static_cast<size_t>(ranks), {});
  const int64_t per_rank = num_pages / ranks;
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<int32_t>& list = free_pages_[static_cast<size_t>(rank)];
    list.reserve(static_cast<size_t>(per_rank));
    for (int64_t page = (rank + 1) * per_rank - 1; page >= rank * per_rank; --page)
      list.push_back(static_cast<int32_t>(page));
  }
  free_offload_pages_.reserve(static_cast<size_t>(offload_pages));
  for (int64_t page = num_pages + offload_pages - 1; page >= num_pages; --page) {
    free_offload_pages_.push_back(static_cast<int32_t>(page));
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

std::optional<int32_t> PageAllocator::allocate_offload() {
  return take(free_offload_pages_, ref_counts_);
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
    (is_offload(page) ? free_offload_pages_ : free_pages_[static_cast<size_t>(rank_of(page))])
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
  std::vector<const std::vector<int32_t>*> lists = {&free_offload_pages_};
  for (const std::vector<int32_t>& list : free_pages_) lists.push_back(&list);
  for (size_t l = 0; l < lists.size(); ++l) {
    for (const int32_t page : *lists[l]) {
      check_page(page);
      MEGACTX_CHECK(
          is_offload(page) == (l == 0) && (l == 0 || rank_of(page) + 1 == static_cast<int>(l)),
          "integrity: KV page {} on another kind's or rank's free list", page);
      MEGACTX_CHECK(!seen[static_cast<size_t>(page)],
                    "integrity: KV page {} twice on the free list", page);
      seen[static_cast<size_t>(page)] = 1;
      MEGACTX_CHECK(ref_counts_[static_cast<size_t>(page)] == 0,
                    "integrity: KV page {} is both free and used", page);
    }
  }
  for (size_t page = 0; page < ref_counts_.size(); ++page) {
    MEGACTX_CHECK(ref_counts_[page] > 0 || seen[page],
                  "integrity: KV page {} is lost (count 0, not free)", page);
  }
}

}  // namespace megactx
