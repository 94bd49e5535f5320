// Offload pages (the live host tier's layout, cache/kv_cache.h): their latent
// entries live in separate host pools, their indexer keys in the indexer
// pools after the device pages'; entries round-trip on both sides of the
// boundary, page copies between device and offload pages move every pool's
// bytes and split runs at the boundary, the allocator hands the two kinds out
// from separate free lists, and bad pools or pages are errors.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cache/host_kv_tier.h"
#include "cache/kv_cache.h"
#include "cache/page_allocator.h"
#include "core/error.h"

namespace megactx {
namespace {

constexpr int64_t kPage = 4;

KvCacheSpec spec_with_offload(int64_t pages, int64_t offload_pages) {
  KvCacheSpec spec;
  spec.num_pages = pages;
  spec.offload_pages = offload_pages;
  spec.page_size = kPage;
  spec.kv_lora_rank = 4;
  spec.qk_rope_head_dim = 2;
  spec.index_head_dim = 4;
  spec.latent_layers = {0, 1};
  spec.indexer_layers = {0};
  spec.dtype = KvDType::F32;
  return spec;
}

float value_of(int64_t layer, int64_t slot, int64_t element) {
  return static_cast<float>(layer * 1000 + slot * 10 + element);
}

void fill(PagedKvCache& cache) {
  const KvCacheSpec& spec = cache.spec();
  for (int64_t slot = 0; slot < spec.total_pages() * kPage; ++slot) {
    for (const int64_t layer : spec.latent_layers) {
      float c_kv[4], k_rope[2];
      for (int e = 0; e < 4; ++e) c_kv[e] = value_of(layer, slot, e);
      for (int e = 0; e < 2; ++e) k_rope[e] = value_of(layer, slot, 4 + e);
      cache.write_latent(layer, slot, c_kv, k_rope);
    }
    float key[4];
    for (int e = 0; e < 4; ++e) key[e] = value_of(7, slot, e);
    cache.write_indexer_key(0, slot, key);
  }
}

TEST(OffloadPages, EntriesLiveInTheirOwnPoolsAndRoundTrip) {
  PagedKvCache cache(spec_with_offload(3, 2));
  EXPECT_EQ(cache.spec().total_pages(), 5);
  EXPECT_EQ(cache.latent_pool(0).dim(0), 3 * kPage);
  EXPECT_EQ(cache.offload_latent_pool(0).dim(0), 2 * kPage);
  EXPECT_EQ(cache.indexer_pool(0).dim(0), 5 * kPage);
  fill(cache);
  for (int64_t slot = 0; slot < 5 * kPage; ++slot) {
    float c_kv[4], k_rope[2], key[4];
    cache.read_latent(1, slot, c_kv, k_rope);
    cache.read_indexer_key(0, slot, key);
    EXPECT_EQ(c_kv[3], value_of(1, slot, 3));
    EXPECT_EQ(k_rope[1], value_of(1, slot, 5));
    EXPECT_EQ(key[2], value_of(7, slot, 2));
  }
  // The first offload slot is the offload pool's first entry.
  EXPECT_EQ(cache.latent_entry(1, 3 * kPage), cache.offload_latent_pool(1).data<std::byte>());
  EXPECT_TRUE(cache.is_offload_page(3));
  EXPECT_FALSE(cache.is_offload_page(2));
  EXPECT_THROW(cache.latent_entry(0, 5 * kPage), Error);
  // Bytes per page: the device part and the host part.
  const KvCacheSpec& spec = cache.spec();
  EXPECT_EQ(spec.bytes_per_page(), spec.latent_bytes_per_page() + spec.indexer_bytes_per_page());
  EXPECT_EQ(spec.latent_bytes_per_page(), kPage * 2 * (4 + 2) * 4);
  EXPECT_EQ(spec.indexer_bytes_per_page(), kPage * 4 * 4);
}

TEST(OffloadPages, PageCopiesMoveEveryPoolAndSplitRunsAtTheBoundary) {
  PagedKvCache cache(spec_with_offload(3, 3));
  fill(cache);
  // Device pages 1, 2 -> offload pages 3, 4 (one run each side: one copy per pool).
  std::vector<const std::byte*> sources;
  std::vector<size_t> sizes;
  const std::vector<int32_t> from = {1, 2}, to = {3, 4};
  for_each_page_run(cache, from, cache, to,
                    [&](const std::byte* source, std::byte* destination, size_t bytes) {
                      sources.push_back(source);
                      sizes.push_back(bytes);
                      std::memmove(destination, source, bytes);
                    });
  EXPECT_EQ(sources.size(), 3u);  // two latent pools and one indexer pool
  EXPECT_EQ(sizes[0], static_cast<size_t>(2 * kPage * cache.spec().latent_bytes_per_token()));
  for (int64_t offset = 0; offset < 2 * kPage; ++offset) {
    float c_kv[4], k_rope[2], key[4];
    cache.read_latent(0, 3 * kPage + offset, c_kv, k_rope);
    cache.read_indexer_key(0, 3 * kPage + offset, key);
    EXPECT_EQ(c_kv[0], value_of(0, kPage + offset, 0));
    EXPECT_EQ(k_rope[0], value_of(0, kPage + offset, 4));
    EXPECT_EQ(key[3], value_of(7, kPage + offset, 3));
  }
  // Pages 2 and 3 are consecutive ids but not consecutive latent memory.
  sources.clear();
  const std::vector<int32_t> across = {2, 3}, back = {0, 1};
  for_each_page_run(cache, across, cache, back, [&](const std::byte* source, std::byte*, size_t) {
    sources.push_back(source);
  });
  EXPECT_EQ(sources.size(), 5u);  // latent: 2 runs x 2 pools; indexer: one run
  // copy_page across the boundary (host pools).
  cache.copy_page(5, 0);
  float c_kv[4], k_rope[2];
  cache.read_latent(1, 0, c_kv, k_rope);
  EXPECT_EQ(c_kv[2], value_of(1, 5 * kPage, 2));
  EXPECT_THROW(cache.copy_page(6, 0), Error);
  EXPECT_THROW(for_each_page_run(cache, std::vector<int32_t>{6}, cache, std::vector<int32_t>{0},
                                 [](const std::byte*, std::byte*, size_t) {}),
               Error);
}

TEST(OffloadPages, PoolsOfTheWrongSizeAreErrors) {
  const KvCacheSpec spec = spec_with_offload(2, 1);
  auto pools = [](int64_t count, int64_t rows, int64_t bytes) {
    std::vector<Tensor> out;
    for (int64_t i = 0; i < count; ++i) out.push_back(Tensor::zeros({rows, bytes}, DType::U8));
    return out;
  };
  const int64_t latent = spec.latent_bytes_per_token(), indexer = spec.indexer_bytes_per_token();
  EXPECT_NO_THROW(PagedKvCache(spec, pools(2, 2 * kPage, latent), pools(1, 3 * kPage, indexer),
                               pools(2, kPage, latent)));
  // Indexer pools without the offload pages' keys, or no offload pools.
  EXPECT_THROW(PagedKvCache(spec, pools(2, 2 * kPage, latent), pools(1, 2 * kPage, indexer),
                            pools(2, kPage, latent)),
               Error);
  EXPECT_THROW(PagedKvCache(spec, pools(2, 2 * kPage, latent), pools(1, 3 * kPage, indexer)),
               Error);
}

TEST(OffloadPages, TheAllocatorHandsOutTheTwoKindsSeparately) {
  PageAllocator allocator(3, 2);
  EXPECT_EQ(allocator.num_pages(), 5);
  EXPECT_EQ(allocator.device_pages(), 3);
  EXPECT_EQ(allocator.offload_pages(), 2);
  EXPECT_EQ(allocator.allocate_offload(), 3);
  EXPECT_EQ(allocator.allocate_offload(), 4);
  EXPECT_FALSE(allocator.allocate_offload().has_value());
  EXPECT_EQ(allocator.num_free(), 3);  // device pages untouched
  EXPECT_EQ(allocator.allocate(), 0);
  EXPECT_EQ(allocator.num_used(), 1);
  EXPECT_EQ(allocator.num_used_offload(), 2);
  allocator.release(4);
  EXPECT_EQ(allocator.num_free_offload(), 1);
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_EQ(allocator.allocate_offload(), 4);  // back on its own list
  allocator.check_integrity({1, 0, 0, 1, 1});
  EXPECT_THROW(allocator.check_integrity({1, 0, 0, 1, 0}), Error);
}

// Data-parallel attention: the offload pages after every rank's device
// pages, a range per rank (cache/rank_pages.h), each rank's from its own
// free list and back to it.
TEST(OffloadPages, EachDataParallelRankHasItsOwnOffloadPages) {
  // 2 ranks of 2 device pages (0-1, 2-3) and 3 offload pages (4-6, 7-9).
  PageAllocator allocator(4, 6, 2);
  EXPECT_EQ(allocator.offload_pages_per_rank(), 3);
  EXPECT_EQ(allocator.allocate_offload(1), 7);
  EXPECT_EQ(allocator.allocate_offload(0), 4);
  EXPECT_EQ(allocator.allocate_offload(1), 8);
  EXPECT_EQ(allocator.allocate_offload(1), 9);
  EXPECT_FALSE(allocator.allocate_offload(1).has_value());  // rank 0's are not rank 1's
  EXPECT_EQ(allocator.num_free_offload(0), 2);
  EXPECT_EQ(allocator.num_used_offload(1), 3);
  EXPECT_EQ(allocator.num_used_offload(), 4);
  EXPECT_EQ(allocator.allocate(1), 2);
  EXPECT_EQ(allocator.rank_of(7), 1);
  EXPECT_EQ(allocator.rank_of(6), 0);
  allocator.release(8);
  EXPECT_EQ(allocator.num_free_offload(1), 1);
  EXPECT_EQ(allocator.num_free_offload(0), 2);
  EXPECT_EQ(allocator.allocate_offload(1), 8);  // back on its rank's list
  allocator.check_integrity({0, 0, 1, 0, 1, 0, 0, 1, 1, 1});
  EXPECT_THROW(PageAllocator(4, 5, 2), Error);  // 5 offload pages do not split over 2 ranks
  EXPECT_THROW(allocator.allocate_offload(2), Error);

  // Each rank's cache numbers its own pages as one process's does: device
  // pages first, then its offload pages.
  const RankPages& layout = allocator.layout();
  EXPECT_EQ(layout.total(), 10);
  EXPECT_EQ(layout.local(3), 1);  // rank 1's second device page
  EXPECT_EQ(layout.local(4), 2);  // rank 0's first offload page
  EXPECT_EQ(layout.local(9), 4);  // rank 1's last offload page
  EXPECT_FALSE(layout.contains(10));
}

}  // namespace
}  // namespace megactx
