#include "engine/routed_experts.h"

#include <algorithm>

#include "core/error.h"

namespace megactx {

RoutedExpertsTable::RoutedExpertsTable(int64_t pages, int64_t host_pages, int64_t page_size,
                                       int64_t layers, int64_t top_k)
    : page_size_(page_size),
      layers_(layers),
      top_k_(top_k),
      device_(static_cast<size_t>(pages * page_size * layers * top_k), -1),
      host_(static_cast<size_t>(host_pages * page_size * layers * top_k), -1) {}

void RoutedExpertsTable::record(const Tensor& routed, int64_t first_row, int64_t start,
                                int64_t count, std::span<const int32_t> page_table) {
  MEGACTX_CHECK(routed.dtype() == DType::I32 && routed.rank() == 3 && routed.dim(1) == layers_ &&
                    routed.dim(2) == top_k_ && first_row + count <= routed.dim(0),
                "routed experts: rows {}..{} of a {} table", first_row, first_row + count,
                shape_string(routed.shape()));
  const int64_t width = row_ints();
  const int32_t* rows = routed.data<int32_t>() + first_row * width;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t position = start + i;
    const auto page = static_cast<size_t>(position / page_size_);
    MEGACTX_CHECK(page < page_table.size(), "routed experts: position {} past the page table",
                  position);
    const int64_t slot = int64_t{page_table[page]} * page_size_ + position % page_size_;
    std::copy_n(rows + i * width, width, device_.begin() + slot * width);
  }
}

std::vector<int32_t> RoutedExpertsTable::gather(std::span<const int32_t> page_table,
                                                int64_t positions) const {
  const int64_t width = row_ints();
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(positions, 0) * width), -1);
  for (int64_t position = 0; position < positions; ++position) {
    const auto page = static_cast<size_t>(position / page_size_);
    if (page >= page_table.size()) break;
    const int64_t slot = int64_t{page_table[page]} * page_size_ + position % page_size_;
    std::copy_n(device_.begin() + slot * width, width, out.begin() + position * width);
  }
  return out;
}

KvPageCopy RoutedExpertsTable::wrap(KvPageCopy copy, const PagedKvCache& device) {
  return [this, copy = std::move(copy), pools = &device](
             const PagedKvCache& from, std::span<const int32_t> from_pages, PagedKvCache& to,
             std::span<const int32_t> to_pages) {
    copy(from, from_pages, to, to_pages);
    // Within the pools (the live host tier's moves to offload pages), a
    // save to the host tier, or a load from it.
    const bool within = &from == &to;
    const bool save = &from == pools;
    const std::vector<int32_t>& source = save || within ? device_ : host_;
    std::vector<int32_t>& destination = save && !within ? host_ : device_;
    const int64_t page_ints = page_size_ * row_ints();
    for (size_t i = 0; i < from_pages.size() && i < to_pages.size(); ++i) {
      std::copy_n(source.begin() + from_pages[i] * page_ints, page_ints,
                  destination.begin() + to_pages[i] * page_ints);
    }
  };
}

}  // namespace megactx
