// The prefix cache's host tier: evicted device pages move to host pages and
// come back, byte for byte, on a later match; the host tier evicts its own
// least recently used pages; a match stops where no device page can be had;
// and a random mix of requests, evictions and flushes keeps every invariant
// (check_integrity) and every matched page's contents.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <unordered_map>

#include "cache/host_kv_tier.h"
#include "cache/kv_cache.h"
#include "cache/page_allocator.h"
#include "cache/prefix_cache.h"
#include "core/error.h"

namespace megactx {
namespace {

constexpr int64_t kPage = 4;

KvCacheSpec small_spec(int64_t pages) {
  KvCacheSpec spec;
  spec.num_pages = pages;
  spec.page_size = kPage;
  spec.kv_lora_rank = 4;
  spec.qk_rope_head_dim = 2;
  spec.index_head_dim = 4;
  spec.latent_layers = {0, 1, 2};
  spec.indexer_layers = {0, 2};
  spec.dtype = KvDType::F32;
  return spec;
}

// What a page of a sequence holds: a value of every float of every pool that
// depends on the sequence's tokens up to the page's end (as real KV would)
// and on the pool, token offset and element.
float expected_value(std::span<const int32_t> prefix, int64_t pool, int64_t offset, int64_t i) {
  uint64_t h = 1469598103934665603ull;
  for (const int32_t t : prefix) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  h = (h ^ static_cast<uint64_t>(pool * 1000 + offset * 10 + i)) * 1099511628211ull;
  return static_cast<float>(h % 100000) / 7.0f;
}

// Writes page `index` (0-based) of `tokens` into device page `page`.
void write_page(PagedKvCache& cache, std::span<const int32_t> tokens, int64_t index, int32_t page) {
  const auto prefix = tokens.subspan(0, static_cast<size_t>((index + 1) * kPage));
  const KvCacheSpec& spec = cache.spec();
  for (int64_t offset = 0; offset < kPage; ++offset) {
    const int64_t slot = page * kPage + offset;
    for (const int64_t layer : spec.latent_layers) {
      std::vector<float> c_kv(4), rope(2);
      for (int64_t i = 0; i < 4; ++i) c_kv[i] = expected_value(prefix, layer, offset, i);
      for (int64_t i = 0; i < 2; ++i) rope[i] = expected_value(prefix, layer, offset, 4 + i);
      cache.write_latent(layer, slot, c_kv.data(), rope.data());
    }
    for (const int64_t layer : spec.indexer_layers) {
      std::vector<float> key(4);
      for (int64_t i = 0; i < 4; ++i) key[i] = expected_value(prefix, 100 + layer, offset, i);
      cache.write_indexer_key(layer, slot, key.data());
    }
  }
}

// True when device page `page` holds page `index` of `tokens`.
bool page_holds(const PagedKvCache& cache, std::span<const int32_t> tokens, int64_t index,
                int32_t page) {
  const auto prefix = tokens.subspan(0, static_cast<size_t>((index + 1) * kPage));
  const KvCacheSpec& spec = cache.spec();
  for (int64_t offset = 0; offset < kPage; ++offset) {
    const int64_t slot = page * kPage + offset;
    for (const int64_t layer : spec.latent_layers) {
      std::vector<float> c_kv(4), rope(2);
      cache.read_latent(layer, slot, c_kv.data(), rope.data());
      for (int64_t i = 0; i < 4; ++i) {
        if (c_kv[i] != expected_value(prefix, layer, offset, i)) return false;
      }
      for (int64_t i = 0; i < 2; ++i) {
        if (rope[i] != expected_value(prefix, layer, offset, 4 + i)) return false;
      }
    }
    for (const int64_t layer : spec.indexer_layers) {
      std::vector<float> key(4);
      cache.read_indexer_key(layer, slot, key.data());
      for (int64_t i = 0; i < 4; ++i) {
        if (key[i] != expected_value(prefix, 100 + layer, offset, i)) return false;
      }
    }
  }
  return true;
}

// A device pool, its allocator, a host tier and the prefix cache over them.
struct Tiers {
  Tiers(int64_t device_pages, int64_t host_pages)
      : device(small_spec(device_pages)),
        allocator(device_pages),
        host(device, std::make_unique<PagedKvCache>(small_spec(host_pages))),
        cache(allocator, kPage, &host) {}
  PagedKvCache device;
  PageAllocator allocator;
  HostKvTier host;
  PrefixCache cache;
};

// One user of the cache, like a request: its tokens, page table and locked node.
struct User {
  User() = default;
  explicit User(std::vector<int32_t> ids) : tokens(std::move(ids)) {}
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  PrefixCache::Node* node = nullptr;
  int64_t matched = 0;  // pages from the cache
};

// Matches, checks the matched pages' contents, computes (writes) the rest
// and inserts the full pages, as a request's prefill would. False when the
// device has no page for the rest.
bool start(Tiers& t, User& user) {
  PrefixCache::Match match = t.cache.match(user.tokens);
  user.pages = match.pages;
  user.node = match.node;
  user.matched = static_cast<int64_t>(match.pages.size());
  for (int64_t i = 0; i < user.matched; ++i) {
    EXPECT_TRUE(page_holds(t.device, user.tokens, i, user.pages[static_cast<size_t>(i)]))
        << "matched page " << i << " holds other contents";
  }
  const int64_t full = static_cast<int64_t>(user.tokens.size()) / kPage;
  while (static_cast<int64_t>(user.pages.size()) < full) {
    std::optional<int32_t> page = t.allocator.allocate();
    if (!page && t.cache.evict(1) == 1) page = t.allocator.allocate();
    if (!page) {
      t.cache.unlock(user.node);
      for (const int32_t p : user.pages) t.allocator.release(p);
      user.pages.clear();
      user.node = nullptr;
      return false;
    }
    write_page(t.device, user.tokens, static_cast<int64_t>(user.pages.size()), *page);
    user.pages.push_back(*page);
  }
  user.node = t.cache.insert(user.node, user.tokens, user.pages, full);
  return true;
}

void finish(Tiers& t, User& user) {
  t.cache.unlock(user.node);
  for (const int32_t page : user.pages) t.allocator.release(page);
  user.pages.clear();
  user.node = nullptr;
}

void check(const Tiers& t, const std::vector<const User*>& users) {
  std::vector<int32_t> holders(static_cast<size_t>(t.allocator.num_pages()), 0);
  std::unordered_map<const PrefixCache::Node*, int64_t> locks;
  for (const User* user : users) {
    for (const int32_t page : user->pages) ++holders[static_cast<size_t>(page)];
    ++locks[user->node];
  }
  t.cache.check_integrity(holders, locks);
  t.allocator.check_integrity(holders);
}

std::vector<int32_t> sequence(int32_t first, int64_t length) {
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) tokens[static_cast<size_t>(i)] = first + int32_t(i);
  return tokens;
}

TEST(HostKvTier, EvictedPagesMoveToTheHostAndComeBackByteForByte) {
  Tiers t(8, 8);
  User a(sequence(10, 13));  // 3 full pages + 1 token
  ASSERT_TRUE(start(t, a));
  finish(t, a);
  EXPECT_EQ(t.cache.cached_pages(), 3);
  EXPECT_EQ(t.cache.evict(3), 3);
  EXPECT_EQ(t.cache.cached_pages(), 0);
  EXPECT_EQ(t.cache.host_cached_pages(), 3);
  EXPECT_EQ(t.host.saved_pages(), 3);
  EXPECT_EQ(t.allocator.num_free(), 8);
  check(t, {});
  // Other contents land in the freed device pages.
  User b(sequence(500, 16));
  ASSERT_TRUE(start(t, b));
  finish(t, b);
  // The host pages come back into whatever device pages are free.
  User again(sequence(10, 13));
  ASSERT_TRUE(start(t, again));  // start() checks the contents
  EXPECT_EQ(again.matched, 3);
  EXPECT_EQ(t.host.loaded_pages(), 3);
  EXPECT_EQ(t.cache.host_hit_tokens(), 3 * kPage);
  EXPECT_EQ(t.cache.hit_tokens(), 3 * kPage);
  check(t, {&again});
  finish(t, again);
  // Loaded pages keep their host copy: evicting them again copies nothing.
  t.cache.flush();
  EXPECT_EQ(t.cache.cached_pages(), 0);
  EXPECT_EQ(t.cache.host_cached_pages(), 0);
  EXPECT_EQ(t.host.allocator().num_free(), 8);
  check(t, {});
}

TEST(HostKvTier, ReevictingAPageWithAHostCopyCopiesNothing) {
  Tiers t(4, 4);
  User a(sequence(0, 8));
  ASSERT_TRUE(start(t, a));
  finish(t, a);
  EXPECT_EQ(t.cache.evict(2), 2);
  User b(sequence(0, 8));
  ASSERT_TRUE(start(t, b));
  EXPECT_EQ(b.matched, 2);
  finish(t, b);
  EXPECT_EQ(t.host.saved_pages(), 2);
  EXPECT_EQ(t.cache.host_cached_pages(), 2);  // the backups stay
  EXPECT_EQ(t.cache.evict(2), 2);
  EXPECT_EQ(t.host.saved_pages(), 2);
  check(t, {});
}

TEST(HostKvTier, TheHostTierDropsItsLeastRecentlyUsedPages) {
  Tiers t(4, 2);
  User a(sequence(0, 4)), b(sequence(100, 4)), c(sequence(200, 4));
  for (User* user : {&a, &b, &c}) {
    ASSERT_TRUE(start(t, *user));
    finish(t, *user);
  }
  // Device LRU order a, b, c; the host holds two pages: a is dropped when c moves.
  EXPECT_EQ(t.cache.evict(3), 3);
  EXPECT_EQ(t.cache.host_cached_pages(), 2);
  check(t, {});
  User a2(sequence(0, 4)), c2(sequence(200, 4));
  ASSERT_TRUE(start(t, a2));
  EXPECT_EQ(a2.matched, 0);
  ASSERT_TRUE(start(t, c2));
  EXPECT_EQ(c2.matched, 1);
  check(t, {&a2, &c2});
  finish(t, a2);
  finish(t, c2);
  check(t, {});
}

TEST(HostKvTier, AMatchStopsWhereNoDevicePageCanBeHad) {
  Tiers t(4, 8);
  User a(sequence(0, 12));  // 3 pages
  ASSERT_TRUE(start(t, a));
  finish(t, a);
  EXPECT_EQ(t.cache.evict(3), 3);
  // A user holding 3 of the 4 device pages leaves one for the match.
  User holder(sequence(900, 12));
  ASSERT_TRUE(start(t, holder));
  PrefixCache::Match match = t.cache.match(sequence(0, 12));
  EXPECT_EQ(match.pages.size(), 1u);
  EXPECT_EQ(match.tokens, kPage);
  User partial(sequence(0, 12));
  partial.pages = match.pages;
  partial.node = match.node;
  EXPECT_TRUE(page_holds(t.device, partial.tokens, 0, partial.pages[0]));
  check(t, {&holder, &partial});
  // The rest stays on the host for later.
  EXPECT_EQ(t.cache.host_cached_pages(), 3);
  finish(t, holder);
  finish(t, partial);
  User all(sequence(0, 12));
  ASSERT_TRUE(start(t, all));
  EXPECT_EQ(all.matched, 3);
  check(t, {&all});
  finish(t, all);
}

TEST(HostKvTier, AFullHostTierDropsAHostOnlyLeafForANewerPage) {
  Tiers t(4, 1);
  User a(sequence(0, 8));
  ASSERT_TRUE(start(t, a));
  finish(t, a);
  User b(sequence(300, 4));
  ASSERT_TRUE(start(t, b));
  EXPECT_EQ(t.cache.evict(1), 1);  // a's second page fills the host
  EXPECT_EQ(t.cache.host_cached_pages(), 1);
  EXPECT_EQ(t.cache.evict(1), 1);  // a's first page: the host drops the second for it
  EXPECT_EQ(t.cache.host_cached_pages(), 1);
  EXPECT_EQ(t.cache.cached_pages(), 1);
  check(t, {&b});
  User a2(sequence(0, 8));
  ASSERT_TRUE(start(t, a2));
  EXPECT_EQ(a2.matched, 1);
  check(t, {&b, &a2});
  finish(t, a2);
  finish(t, b);
  check(t, {});
}

TEST(HostKvTier, RecomputedPagesBecomeTheDeviceCopyOfHostNodes) {
  Tiers t(3, 8);
  User a(sequence(0, 8));
  ASSERT_TRUE(start(t, a));
  finish(t, a);
  EXPECT_EQ(t.cache.evict(2), 2);
  // Three device pages held by another user: the match can load nothing.
  User holder(sequence(900, 12));
  ASSERT_TRUE(start(t, holder));
  PrefixCache::Match match = t.cache.match(sequence(0, 8));
  EXPECT_TRUE(match.pages.empty());
  EXPECT_EQ(match.node, t.cache.root());
  check(t, {&holder});
  finish(t, holder);
  t.cache.flush();
  // A request that computed the pages again (it started before they were
  // evicted, say) inserts them over the host-only nodes: they become their
  // device copies and the host copies stay as backups.
  User b(sequence(0, 8));
  ASSERT_TRUE(start(t, b));
  finish(t, b);
  EXPECT_EQ(t.cache.evict(2), 2);
  User c(sequence(0, 8));
  c.node = t.cache.root();
  for (int64_t i = 0; i < 2; ++i) {
    const int32_t page = *t.allocator.allocate();
    write_page(t.device, c.tokens, i, page);
    c.pages.push_back(page);
  }
  c.node = t.cache.insert(c.node, c.tokens, c.pages, 2);
  EXPECT_EQ(PrefixCache::depth(c.node), 2);
  EXPECT_EQ(t.cache.cached_pages(), 2);
  EXPECT_EQ(t.cache.host_cached_pages(), 2);
  EXPECT_EQ(t.host.loaded_pages(), 0);
  check(t, {&c});
  finish(t, c);
  check(t, {});
}

TEST(HostKvTier, WithoutAnyDroppableHostPageEvictionDropsTheNode) {
  Tiers t(4, 1);
  User x(sequence(0, 4));
  ASSERT_TRUE(start(t, x));
  finish(t, x);
  EXPECT_EQ(t.cache.evict(1), 1);  // x's page fills the host
  User x2(sequence(0, 4));
  ASSERT_TRUE(start(t, x2));  // loaded back; its host copy is a locked node's backup
  EXPECT_EQ(x2.matched, 1);
  User y(sequence(300, 4));
  ASSERT_TRUE(start(t, y));
  finish(t, y);
  EXPECT_EQ(t.cache.evict(1), 1);  // y: no host page to be had, so it is dropped
  EXPECT_EQ(t.cache.cached_pages(), 1);
  EXPECT_EQ(t.cache.host_cached_pages(), 1);
  EXPECT_EQ(t.host.saved_pages(), 1);
  check(t, {&x2});
  User y2(sequence(300, 4));
  ASSERT_TRUE(start(t, y2));
  EXPECT_EQ(y2.matched, 0);
  check(t, {&x2, &y2});
  finish(t, x2);
  finish(t, y2);
  // Unlocked now: x's backup can be dropped, so the next eviction moves a page.
  EXPECT_EQ(t.cache.evict(1), 1);
  EXPECT_EQ(t.cache.host_cached_pages(), 1);
  check(t, {});
}

TEST(HostKvTier, RandomRequestsEvictionsAndFlushesKeepEveryInvariant) {
  std::mt19937_64 rng(1234);
  Tiers t(12, 10);
  // Sequences over a few shared prefixes so the tree branches.
  std::vector<std::vector<int32_t>> stems = {sequence(0, 8), sequence(50, 4), sequence(80, 12)};
  std::map<int, User> live;
  int next = 0;
  int64_t matched_pages = 0;
  for (int op = 0; op < 20000; ++op) {
    const int choice = static_cast<int>(rng() % 10);
    if (choice < 5 && live.size() < 3) {
      User user;
      user.tokens = stems[rng() % stems.size()];
      const int64_t extra = static_cast<int64_t>(rng() % 9);
      for (int64_t i = 0; i < extra; ++i) user.tokens.push_back(static_cast<int32_t>(rng() % 3));
      if (start(t, user)) {
        matched_pages += user.matched;
        live.emplace(next++, std::move(user));
      }
    } else if (choice < 8 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      finish(t, it->second);
      live.erase(it);
    } else if (choice == 8) {
      t.cache.evict(static_cast<int64_t>(rng() % 4));
    } else if (rng() % 20 == 0) {
      t.cache.flush();
    }
    std::vector<const User*> users;
    for (const auto& [id, user] : live) users.push_back(&user);
    check(t, users);
  }
  EXPECT_GT(matched_pages, 100);
  EXPECT_GT(t.host.saved_pages(), 50);
  EXPECT_GT(t.host.loaded_pages(), 50);
  EXPECT_GT(t.cache.host_hit_tokens(), 0);
}

TEST(KvPageCopy, RunsOfPagesAndBadCopies) {
  PagedKvCache a(small_spec(6)), b(small_spec(5));
  const std::vector<int32_t> tokens = sequence(0, 12);
  for (int64_t i = 0; i < 3; ++i) write_page(a, tokens, i, static_cast<int32_t>(i + 1));
  const int32_t from[] = {1, 2, 3};
  const int32_t to[] = {4, 0, 1};
  copy_kv_pages_on_host(a, from, b, to);
  EXPECT_TRUE(page_holds(b, tokens, 0, 4));
  EXPECT_TRUE(page_holds(b, tokens, 1, 0));
  EXPECT_TRUE(page_holds(b, tokens, 2, 1));
  const int32_t past[] = {5};
  const int32_t one[] = {0};
  EXPECT_THROW(copy_kv_pages_on_host(a, one, b, past), Error);
  EXPECT_THROW(copy_kv_pages_on_host(a, from, b, one), Error);
  KvCacheSpec other = small_spec(5);
  other.dtype = KvDType::BF16;
  PagedKvCache c(other);
  EXPECT_THROW(copy_kv_pages_on_host(a, one, c, one), Error);
  EXPECT_THROW(HostKvTier(a, std::make_unique<PagedKvCache>(other)), Error);
  EXPECT_THROW(HostKvTier(a, std::make_unique<PagedKvCache>(small_spec(0))), Error);
}

}  // namespace
}  // namespace megactx
