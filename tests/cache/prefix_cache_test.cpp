// Page allocator and prefix cache: reference counts, sharing, LRU eviction and
// the invariants check_integrity() enforces, against hand-worked expectations.
#include <gtest/gtest.h>

#include <numeric>
#include <unordered_map>

#include "cache/page_allocator.h"
#include "cache/prefix_cache.h"
#include "core/error.h"

namespace megactx {
namespace {

constexpr int64_t kPage = 4;

std::vector<int32_t> sequence(int32_t first, int64_t length) {
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

// One user of the cache, like a request: its page table and its locked node.
struct User {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  PrefixCache::Node* node = nullptr;
};

void check(const PageAllocator& allocator, const PrefixCache& cache,
           const std::vector<const User*>& users) {
  std::vector<int32_t> holders(static_cast<size_t>(allocator.num_pages()), 0);
  std::unordered_map<const PrefixCache::Node*, int64_t> locks;
  for (const User* user : users) {
    for (const int32_t page : user->pages) ++holders[static_cast<size_t>(page)];
    ++locks[user->node];
  }
  cache.check_integrity(holders, locks);
  allocator.check_integrity(holders);
}

TEST(PageAllocator, CountsAndFreeList) {
  PageAllocator allocator(3);
  EXPECT_EQ(allocator.allocate(), 0);
  EXPECT_EQ(allocator.allocate(), 1);
  allocator.add_ref(1);
  allocator.release(1);
  EXPECT_EQ(allocator.ref_count(1), 1);
  EXPECT_EQ(allocator.num_free(), 1);
  EXPECT_EQ(allocator.allocate(), 2);
  EXPECT_FALSE(allocator.allocate().has_value());
  allocator.release(0);
  EXPECT_EQ(allocator.num_free(), 1);
  allocator.check_integrity({0, 1, 1});
  EXPECT_THROW(allocator.check_integrity({0, 2, 1}), Error);
  EXPECT_THROW(allocator.release(0), Error);  // already free
  EXPECT_THROW(allocator.add_ref(0), Error);  // free pages cannot gain holders
  EXPECT_THROW(allocator.release(7), Error);  // out of range
}

TEST(PrefixCache, MatchSharesFullPagesOnly) {
  PageAllocator allocator(16);
  PrefixCache cache(allocator, kPage);
  User a;
  a.tokens = sequence(100, 10);  // 2 full pages + 2 tokens
  a.node = cache.match(a.tokens).node;
  EXPECT_EQ(a.node, cache.root());
  for (int i = 0; i < 3; ++i) a.pages.push_back(*allocator.allocate());
  a.node = cache.insert(a.node, a.tokens, a.pages, 2);
  EXPECT_EQ(PrefixCache::depth(a.node), 2);
  EXPECT_EQ(cache.cached_pages(), 2);
  EXPECT_EQ(cache.evictable_pages(), 0);  // locked by a
  check(allocator, cache, {&a});
  EXPECT_EQ(allocator.ref_count(a.pages[0]), 2);  // a + tree
  EXPECT_EQ(allocator.ref_count(a.pages[2]), 1);  // partial page: private

  // Same first page, different second page: one page hit.
  User b;
  b.tokens = sequence(100, 6);
  b.tokens[5] = 7;
  PrefixCache::Match match = cache.match(b.tokens);
  EXPECT_EQ(match.tokens, kPage);
  ASSERT_EQ(match.pages.size(), 1u);
  EXPECT_EQ(match.pages[0], a.pages[0]);
  b.pages = match.pages;
  b.node = match.node;
  EXPECT_EQ(cache.hit_tokens(), kPage);
  EXPECT_EQ(cache.queried_tokens(), 10 + 6);
  check(allocator, cache, {&a, &b});
  EXPECT_EQ(allocator.ref_count(a.pages[0]), 3);
}

TEST(PrefixCache, DuplicatePagesAreMergedIntoTheTreeCopy) {
  PageAllocator allocator(8);
  PrefixCache cache(allocator, kPage);
  User a, b;
  a.tokens = b.tokens = sequence(0, 8);
  a.node = cache.match(a.tokens).node;
  b.node = cache.match(b.tokens).node;
  for (int i = 0; i < 2; ++i) a.pages.push_back(*allocator.allocate());
  for (int i = 0; i < 2; ++i) b.pages.push_back(*allocator.allocate());
  a.node = cache.insert(a.node, a.tokens, a.pages, 2);
  b.node = cache.insert(b.node, b.tokens, b.pages, 2);
  EXPECT_EQ(a.pages, b.pages);         // b now uses the tree's pages
  EXPECT_EQ(allocator.num_free(), 6);  // b's own copies went back
  EXPECT_EQ(a.node, b.node);
  check(allocator, cache, {&a, &b});
}

TEST(PrefixCache, EvictsLeastRecentlyUsedUnlockedLeavesFirst) {
  PageAllocator allocator(8);
  PrefixCache cache(allocator, kPage);
  // Three sequences sharing page 0: [P0 P1], [P0 P2], then a reuse of [P0 P1].
  auto add = [&](std::vector<int32_t> tokens) {
    User user;
    user.tokens = std::move(tokens);
    PrefixCache::Match match = cache.match(user.tokens);
    user.pages = match.pages;
    user.node = match.node;
    const int64_t full = static_cast<int64_t>(user.tokens.size()) / kPage;
    while (static_cast<int64_t>(user.pages.size()) < full)
      user.pages.push_back(*allocator.allocate());
    user.node = cache.insert(user.node, user.tokens, user.pages, full);
    return user;
  };
  auto done = [&](User& user) {
    cache.unlock(user.node);
    for (const int32_t page : user.pages) allocator.release(page);
  };
  std::vector<int32_t> first = sequence(0, 8);
  std::vector<int32_t> second = sequence(0, 8);
  second[6] = 99;
  User u1 = add(first);
  User u2 = add(second);
  const int32_t p1 = u1.pages[1];
  const int32_t p2 = u2.pages[1];
  done(u1);
  done(u2);
  check(allocator, cache, {});
  EXPECT_EQ(cache.evictable_pages(), 3);
  User u3 = add(first);  // touches P0 and P1: P2 is now the oldest leaf
  done(u3);
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(allocator.ref_count(p2), 0);
  EXPECT_EQ(allocator.ref_count(p1), 1);
  check(allocator, cache, {});
  // A locked path is never evicted.
  User u4 = add(first);
  EXPECT_EQ(cache.evict(10), 0);
  check(allocator, cache, {&u4});
  done(u4);
  EXPECT_EQ(cache.evict(10), 2);  // leaf P1, then its parent P0
  EXPECT_EQ(allocator.num_free(), 8);
  check(allocator, cache, {});
}

TEST(PrefixCache, IntegrityDetectsAWrongLockCount) {
  PageAllocator allocator(4);
  PrefixCache cache(allocator, kPage);
  User a;
  a.tokens = sequence(0, 4);
  a.node = cache.match(a.tokens).node;
  a.pages.push_back(*allocator.allocate());
  a.node = cache.insert(a.node, a.tokens, a.pages, 1);
  check(allocator, cache, {&a});
  EXPECT_THROW(check(allocator, cache, {}), Error);  // the tree says someone locks it
  User ghost = a;
  EXPECT_THROW(check(allocator, cache, {&a, &ghost}), Error);
}

}  // namespace
}  // namespace megactx
