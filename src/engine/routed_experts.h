// Routing replay for MoE RL (SGLang's return_routed_experts): which experts
// every token of a request was routed to, at every layer.
//
// The forward reports the ids of the tokens it computes; a prefix-cache hit
// computes nothing, so the ids are kept per KV slot, as the KV itself is: a
// table [slots, layers, top_k] int32 beside the device pools (and one beside
// the host tier's pages, copied with the pages), written after every forward
// and read when a request finishes. Host memory: layers x top_k x 4 bytes per
// KV token (GLM-5.2: 2.4 KiB, so 2.4 GiB at 1M tokens); only with
// --enable-return-routed-experts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/host_kv_tier.h"
#include "core/tensor.h"

namespace megactx {

class RoutedExpertsTable {
 public:
  // pages: every page id of the pools (device and offload pages).
  RoutedExpertsTable(int64_t pages, int64_t host_pages, int64_t page_size, int64_t layers,
                     int64_t top_k);

  int64_t row_ints() const { return layers_ * top_k_; }

  // routed [rows, layers, top_k] of a forward; rows [first_row, first_row +
  // count) are positions start .. start + count - 1 of the sequence paged by
  // `page_table`.
  void record(const Tensor& routed, int64_t first_row, int64_t start, int64_t count,
              std::span<const int32_t> page_table);

  // [positions, layers, top_k] of positions 0 .. positions - 1 (-1 rows past
  // the page table: a request retracted and never re-admitted).
  std::vector<int32_t> gather(std::span<const int32_t> page_table, int64_t positions) const;

  // `copy` that also moves the pages' rows between this table's device and
  // host parts (the host tier's saves and loads), or within its device part
  // (copies from the pools to themselves: the live host tier's offload
  // pages, whose ids follow the device pages'). `device` is the engine's
  // pool (other copies from it are saves).
  KvPageCopy wrap(KvPageCopy copy, const PagedKvCache& device);

 private:
  int64_t page_size_, layers_, top_k_;
  std::vector<int32_t> device_, host_;
};

}  // namespace megactx
