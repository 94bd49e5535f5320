#include "cache/page_allocator.h"

#include "core/error.h"

namespace megactx {

PageAllocator::PageAllocator(int64_t num_pages) {
  MEGACTX_CHECK(num_pages >= 0 && num_pages <= INT32_MAX, "invalid KV page count {}", num_pages);
  ref_counts_.assign(static_cast<size_t>(num_pages), 0);
  free_pages_.reserve(static_cast<size_t>(num_pages));
  for (int64_t page = num_pages - 1; page >= 0; --page) {
    free_pages_.push_back(static_cast<int32_t>(page));
  }
}

std::optional<int32_t> PageAllocator::allocate() {
  if (free_pages_.empty()) return std::nullopt;
  const int32_t page = free_pages_.back();
  free_pages_.pop_back();
  ref_counts_[static_cast<size_t>(page)] = 1;
  return page;
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
  if (--count == 0) free_pages_.push_back(page);
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
  for (const int32_t page : free_pages_) {
    check_page(page);
    MEGACTX_CHECK(!seen[static_cast<size_t>(page)], "integrity: KV page {} twice on the free list",
                  page);
    seen[static_cast<size_t>(page)] = 1;
    MEGACTX_CHECK(ref_counts_[static_cast<size_t>(page)] == 0,
                  "integrity: KV page {} is both free and used", page);
  }
  for (size_t page = 0; page < ref_counts_.size(); ++page) {
    MEGACTX_CHECK(ref_counts_[page] > 0 || seen[page],
                  "integrity: KV page {} is lost (count 0, not free)", page);
  }
}

}  // namespace megactx
