// The scheduler with data-parallel attention (an allocator of 2 ranks, one
// prefix cache per rank): requests spread over the ranks, each with pages of
// its own rank only; the prefill budget is per rank; a prefix hit brings a
// request back to the rank that caches it; a rank short of pages preempts its
// own latest request, not another rank's; a removed request's pages go back
// to its rank; with a host tier, a rank's evicted prefix goes to host pages
// of that rank and comes back to device pages of that rank; admission passes
// over a request that fits no rank, within its window and its bound on skips;
// with the live host tier a request's pages move to its own rank's offload
// pages (read there with local ids), and a parked request's pages go back
// only to a request of its rank.
// check_integrity() after every step.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/host_kv_tier.h"
#include "core/error.h"
#include "engine/scheduler.h"
#include "model/dp_attention_batch.h"
#include "scheduler_request.h"

namespace megactx {
namespace {

constexpr int kRanks = 2;

struct DpBench {
  DpBench(int64_t pages_per_rank, SchedulerConfig config, HostKvTier* tier = nullptr,
          int64_t offload_per_rank = 0)
      : allocator(pages_per_rank * kRanks, offload_per_rank * kRanks, kRanks),
        caches{std::make_unique<PrefixCache>(allocator, config.page_size, tier, 0),
               std::make_unique<PrefixCache>(allocator, config.page_size, tier, 1)},
        scheduler(config, allocator, {caches[0].get(), caches[1].get()}) {}

  RequestState* add(const std::string& rid, int64_t prompt_len, int32_t base = 0) {
    return enqueue_request(scheduler, requests, rid, prompt_len, base);
  }

  // One step; every running request's pages on its own rank.
  StepPlan step() {
    StepPlan plan = scheduler_step(scheduler);
    for (const RequestState* request : scheduler.running())
      for (const int32_t page : request->page_table)
        EXPECT_EQ(allocator.rank_of(page), request->dp_rank) << request->request.rid;
    return plan;
  }

  PageAllocator allocator;
  std::unique_ptr<PrefixCache> caches[kRanks];
  Scheduler scheduler;
  std::vector<std::unique_ptr<RequestState>> requests;
};

TEST(DataParallelScheduler, RequestsSpreadOverTheRanksWithABudgetEach) {
  SchedulerConfig config;
  config.max_prefill_tokens = 100;
  DpBench bench(8, config);
  RequestState* a = bench.add("a", 80, 0);
  RequestState* b = bench.add("b", 80, 1000);
  RequestState* c = bench.add("c", 80, 2000);
  RequestState* d = bench.add("d", 80, 3000);
  const StepPlan first = bench.step();
  // The fewest running requests first, then the most free pages, then the lowest rank.
  EXPECT_EQ(a->dp_rank, 0);
  EXPECT_EQ(b->dp_rank, 1);
  EXPECT_EQ(c->dp_rank, 0);
  EXPECT_EQ(d->dp_rank, 1);
  // 100 prefill tokens per rank: twice one process's budget.
  EXPECT_EQ(first.prefill_tokens, 200);
  ASSERT_EQ(first.chunks.size(), 4u);
  EXPECT_EQ(first.chunks[2].count, 20);
  EXPECT_EQ(first.chunks[3].count, 20);
  EXPECT_EQ(bench.scheduler.running_on(0), 2);
  EXPECT_EQ(bench.scheduler.admissions(1), 2);
  // A removed request's pages (but its cached full page) go back to its rank.
  const int64_t free_before = bench.allocator.num_free(1);
  bench.scheduler.remove(b);
  EXPECT_EQ(bench.allocator.num_free(1), free_before + 1);  // 2 pages, 1 of them cached
  EXPECT_EQ(bench.caches[1]->cached_pages(), 1);
  bench.step();
}

TEST(DataParallelScheduler, APrefixHitKeepsARequestOnItsRank) {
  SchedulerConfig config;
  DpBench bench(8, config);
  RequestState* first = bench.add("first", 200, 0);
  bench.step();
  ASSERT_EQ(first->dp_rank, 0);
  bench.scheduler.remove(first);  // its 3 full pages stay in rank 0's prefix cache
  ASSERT_EQ(bench.caches[0]->cached_prefix_tokens(first->tokens), 192);
  // Another prompt goes where more pages are free; one sharing the first's
  // prefix goes back to rank 0 (where its pages are), though rank 0 runs one too.
  RequestState* other = bench.add("other", 100, 5000);
  bench.step();
  EXPECT_EQ(other->dp_rank, 1);
  RequestState* again = bench.add("again", 230, 0);
  RequestState* third = bench.add("third", 100, 7000);
  bench.step();
  EXPECT_EQ(again->dp_rank, 0);
  EXPECT_EQ(again->cached_tokens, 192);
  EXPECT_EQ(third->dp_rank, 1);  // both run one: rank 1 has more free pages (6 to 4)
}

// --load-balance-method: a prompt sharing a prefix cached on rank 0 goes there
// with cache_aware, to the rank in turn with round_robin, to the rank with
// fewer running requests with shortest_queue; minimum_tokens weighs the
// running requests by their tokens.
TEST(DataParallelScheduler, TheLoadBalanceMethodsPickTheirOwnRanks) {
  const auto prefix_then_again = [](DpLoadBalance method) {
    SchedulerConfig config;
    config.dp_load_balance = method;
    DpBench bench(32, config);
    RequestState* first = bench.add("first", 200, 0);
    bench.step();
    EXPECT_EQ(first->dp_rank, 0);
    bench.scheduler.remove(first);  // 3 full pages cached on rank 0
    RequestState* a = bench.add("a", 100, 3000);
    bench.step();
    RequestState* b = bench.add("b", 100, 4000);
    bench.step();
    EXPECT_NE(a->dp_rank, b->dp_rank);
    // Rank 0 runs one request and caches the prefix; rank 1 runs none.
    bench.scheduler.remove(a->dp_rank == 1 ? a : b);
    RequestState* again = bench.add("again", 230, 0);
    bench.step();
    return again->dp_rank;
  };
  EXPECT_EQ(prefix_then_again(DpLoadBalance::CacheAware), 0);     // its cached prefix
  EXPECT_EQ(prefix_then_again(DpLoadBalance::ShortestQueue), 1);  // 0 running against 1
  {
    // Round robin: every admission passes the turn on, the cached prefix aside.
    SchedulerConfig config;
    config.dp_load_balance = DpLoadBalance::RoundRobin;
    DpBench bench(32, config);
    RequestState* first = bench.add("first", 200, 0);
    bench.step();
    bench.scheduler.remove(first);
    RequestState* again = bench.add("again", 230, 0);
    RequestState* next = bench.add("next", 100, 5000);
    RequestState* last = bench.add("last", 100, 6000);
    bench.step();
    EXPECT_EQ(first->dp_rank, 0);
    EXPECT_EQ(again->dp_rank, 1);
    EXPECT_EQ(again->cached_tokens, 0);
    EXPECT_EQ(next->dp_rank, 0);
    EXPECT_EQ(last->dp_rank, 1);
  }
  const auto long_and_short = [](DpLoadBalance method) {
    SchedulerConfig config;
    config.dp_load_balance = method;
    DpBench bench(32, config);
    RequestState* heavy = bench.add("long", 1000, 10000);
    bench.step();
    RequestState* s1 = bench.add("s1", 100, 20000);
    bench.step();
    RequestState* s2 = bench.add("s2", 100, 30000);
    bench.step();
    EXPECT_EQ(heavy->dp_rank, 0);
    EXPECT_EQ(s1->dp_rank, 1);
    EXPECT_EQ(s2->dp_rank, 1);
    // Rank 0: one request of 1000 tokens; rank 1: two of 100.
    RequestState* s3 = bench.add("s3", 100, 40000);
    bench.step();
    return s3->dp_rank;
  };
  EXPECT_EQ(long_and_short(DpLoadBalance::ShortestQueue), 0);
  EXPECT_EQ(long_and_short(DpLoadBalance::MinimumTokens), 1);
  for (const char* name : {"cache_aware", "round_robin", "shortest_queue", "minimum_tokens"})
    EXPECT_STREQ(dp_load_balance_name(parse_dp_load_balance(name)), name);
  try {
    parse_dp_load_balance("random");
    ADD_FAILURE() << "an unknown method was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("round_robin"), std::string::npos) << error.what();
  }
}

TEST(DataParallelScheduler, ARequestGoesWhereItFitsBeforeItsCachedPrefix) {
  SchedulerConfig config;
  DpBench bench(8, config);
  RequestState* first = bench.add("first", 200, 0);
  bench.step();
  bench.scheduler.remove(first);  // 3 full pages cached on rank 0, 5 free
  RequestState* a = bench.add("a", 100, 3000);
  bench.step();
  RequestState* b = bench.add("b", 300, 4000);
  bench.step();
  ASSERT_EQ(a->dp_rank, 1);
  ASSERT_EQ(b->dp_rank, 0);  // rank 0's 5 free pages, its cached ones untouched
  ASSERT_EQ(bench.caches[0]->cached_prefix_tokens(first->tokens), 192);
  // Rank 0 caches 192 tokens of it but has no page for the rest: rank 1 does.
  RequestState* again = bench.add("again", 230, 0);
  bench.step();
  EXPECT_EQ(again->dp_rank, 1);
  EXPECT_EQ(again->phase, RequestPhase::Running);
  EXPECT_EQ(again->cached_tokens, 0);
}

TEST(DataParallelScheduler, ARankShortOfPagesPreemptsItsOwnLatestRequest) {
  SchedulerConfig config;
  DpBench bench(4, config);  // 4 pages of 64 tokens per rank
  RequestState* a = bench.add("a", 60, 0);
  RequestState* b = bench.add("b", 60, 1000);
  RequestState* c = bench.add("c", 60, 2000);
  RequestState* d = bench.add("d", 60, 3000);
  bench.step();
  ASSERT_EQ(a->dp_rank, 0);
  ASSERT_EQ(c->dp_rank, 0);
  ASSERT_EQ(d->dp_rank, 1);
  // Rank 1 keeps one request from here on: it has pages to spare.
  bench.scheduler.remove(b);
  std::vector<RequestState*> preempted;
  for (int step = 0; step < 200 && preempted.empty(); ++step) {
    const StepPlan plan = bench.step();
    preempted = plan.preempted;
  }
  // Rank 0's two requests need 6 pages by position 129: c (admitted after d)
  // goes, d on rank 1 keeps running.
  ASSERT_EQ(preempted.size(), 1u);
  EXPECT_EQ(preempted[0], c);
  EXPECT_EQ(d->phase, RequestPhase::Running);
  EXPECT_EQ(a->phase, RequestPhase::Running);
  EXPECT_EQ(bench.scheduler.num_preemptions(), 1);
}

// Admission looks past a request that fits no rank: a short request behind
// it that fits one is admitted now (FIFO kept it waiting for pages the long
// one could not use yet).
TEST(DataParallelScheduler, AShortRequestIsAdmittedPastOneThatFitsNoRank) {
  SchedulerConfig config;
  DpBench bench(4, config);  // 4 pages of 64 tokens per rank
  RequestState* a = bench.add("a", 100, 0);
  RequestState* b = bench.add("b", 100, 1000);
  bench.step();
  ASSERT_EQ(a->dp_rank, 0);
  ASSERT_EQ(b->dp_rank, 1);
  // Each rank has 2 free pages and one running request: `big` needs 4 + 1 of
  // headroom on either, `small` 1 + 1.
  RequestState* big = bench.add("big", 200, 2000);
  RequestState* small = bench.add("small", 10, 3000);
  const StepPlan plan = bench.step();
  EXPECT_EQ(small->phase, RequestPhase::Running);
  ASSERT_EQ(plan.chunks.size(), 3u);  // a's and b's decodes, small's prefill
  EXPECT_EQ(plan.chunks[2].request, small);
  EXPECT_EQ(plan.prefill_tokens, 10);
  // The long one keeps its place at the front, counted as passed over once.
  EXPECT_EQ(big->phase, RequestPhase::Waiting);
  ASSERT_EQ(bench.scheduler.waiting().size(), 1u);
  EXPECT_EQ(bench.scheduler.waiting().front(), big);
  EXPECT_TRUE(big->page_table.empty());
  EXPECT_EQ(big->admission_skips, 1);
  // When a rank empties, it goes there.
  ASSERT_EQ(small->dp_rank, 0);
  bench.scheduler.remove(a);
  bench.scheduler.remove(small);
  bench.step();
  EXPECT_EQ(big->phase, RequestPhase::Running);
  EXPECT_EQ(big->dp_rank, 0);
  EXPECT_EQ(big->admission_skips, 0);
}

// dp_admission_max_skips: a request passed over in that many steps stops
// admission until it fits; the short ones behind it wait, so it cannot starve.
TEST(DataParallelScheduler, ARequestPassedOverTooOftenStopsAdmissionUntilItFits) {
  SchedulerConfig config;
  config.dp_admission_max_skips = 2;
  DpBench bench(8, config);
  RequestState* a = bench.add("a", 100, 0);
  RequestState* b = bench.add("b", 100, 1000);
  bench.step();
  ASSERT_EQ(b->dp_rank, 1);
  // 7 pages + 1 of headroom: more than either rank's 6 free pages.
  RequestState* big = bench.add("big", 400, 2000);
  RequestState* small1 = bench.add("small1", 10, 3000);
  bench.step();
  RequestState* small2 = bench.add("small2", 10, 4000);
  bench.step();
  EXPECT_EQ(small1->phase, RequestPhase::Running);
  EXPECT_EQ(small2->phase, RequestPhase::Running);
  EXPECT_EQ(big->admission_skips, 2);
  // Passed over twice: small3 would fit (either rank has 5 free pages) but waits.
  RequestState* small3 = bench.add("small3", 10, 5000);
  for (int step = 0; step < 3; ++step) {
    const StepPlan plan = bench.step();
    EXPECT_EQ(plan.prefill_tokens, 0);
    EXPECT_EQ(small3->phase, RequestPhase::Waiting);
    EXPECT_EQ(big->phase, RequestPhase::Waiting);
  }
  EXPECT_EQ(big->admission_skips, 2);
  ASSERT_EQ(small1->dp_rank, 0);
  // Rank 0 empties: big goes there first, then small3 on rank 1.
  bench.scheduler.remove(a);
  bench.scheduler.remove(small1);
  const StepPlan plan = bench.step();
  EXPECT_EQ(big->phase, RequestPhase::Running);
  EXPECT_EQ(big->dp_rank, 0);
  EXPECT_EQ(small3->phase, RequestPhase::Running);
  EXPECT_EQ(small3->dp_rank, 1);
  EXPECT_EQ(plan.prefill_tokens, 410);
}

// dp_admission_window: the most requests passed over in one step; past it
// admission ends for the step even though a later request would fit.
TEST(DataParallelScheduler, AdmissionLooksPastAtMostTheWindow) {
  SchedulerConfig config;
  config.dp_admission_window = 1;
  DpBench bench(4, config);
  bench.add("a", 100, 0);
  bench.add("b", 100, 1000);
  bench.step();
  RequestState* big1 = bench.add("big1", 200, 2000);
  RequestState* big2 = bench.add("big2", 200, 3000);
  RequestState* small = bench.add("small", 10, 4000);
  bench.step();
  EXPECT_EQ(small->phase, RequestPhase::Waiting);
  // Nothing was admitted past them: neither counts as passed over.
  EXPECT_EQ(big1->admission_skips, 0);
  EXPECT_EQ(big2->admission_skips, 0);
  ASSERT_EQ(bench.scheduler.waiting().size(), 3u);
  EXPECT_EQ(bench.scheduler.waiting()[0], big1);
  EXPECT_EQ(bench.scheduler.waiting()[2], small);
}

}  // namespace
}  // namespace megactx

namespace megactx {
namespace {

KvCacheSpec tiny_spec(int64_t pages, int64_t page_size) {
  KvCacheSpec spec;
  spec.num_pages = pages;
  spec.page_size = page_size;
  spec.kv_lora_rank = 4;
  spec.qk_rope_head_dim = 2;
  spec.latent_layers = {0};
  spec.dtype = KvDType::F32;
  return spec;
}

// Each rank's device and host pools, as a serving group holds them; the
// tier's copies go to the pools of the pages' rank (as the group leader
// sends them), recorded by rank.
TEST(DataParallelScheduler, AHostTierKeepsEvictedPagesOnTheirRank) {
  SchedulerConfig config;
  config.page_size = 4;
  constexpr int64_t kPages = 4;
  PagedKvCache device[kRanks] = {PagedKvCache(tiny_spec(kPages, 4)),
                                 PagedKvCache(tiny_spec(kPages, 4))};
  PagedKvCache host1(tiny_spec(kPages, 4));
  auto host0 = std::make_unique<PagedKvCache>(tiny_spec(kPages, 4));
  PagedKvCache* host[kRanks] = {host0.get(), &host1};
  std::vector<int> copies_by_rank(kRanks, 0);
  const KvPageCopy copy = [&](const PagedKvCache& from, std::span<const int32_t> from_pages,
                              PagedKvCache& to, std::span<const int32_t> to_pages) {
    const bool to_host = &to == host[0];
    for (int rank = 0; rank < kRanks; ++rank) {
      const RankPagePairs own = rank_page_pairs(from_pages, to_pages, RankPages{kPages, 0, kRanks},
                                                RankPages{kPages, 0, kRanks}, rank);
      if (own.from.empty()) continue;
      copies_by_rank[static_cast<size_t>(rank)] += static_cast<int>(own.from.size());
      if (to_host)
        copy_kv_pages_on_host(device[rank], own.from, *host[rank], own.to);
      else
        copy_kv_pages_on_host(*host[rank], own.from, device[rank], own.to);
    }
  };
  HostKvTier tier(device[0], std::move(host0), copy, kRanks);
  ASSERT_EQ(tier.num_pages(), kRanks * kPages);
  DpBench bench(kPages, config, &tier);
  RequestState* first = bench.add("first", 12, 0);
  bench.step();
  bench.scheduler.remove(first);  // 3 full pages cached on rank 0
  RequestState* b = bench.add("b", 15, 100);
  bench.step();
  RequestState* c = bench.add("c", 15, 200);
  bench.step();
  ASSERT_EQ(b->dp_rank, 1);
  ASSERT_EQ(c->dp_rank, 0);  // fewer running requests: it evicts the cached pages to the host
  EXPECT_EQ(tier.allocator().num_free(0), kPages - 3);
  EXPECT_EQ(tier.allocator().num_free(1), kPages);
  EXPECT_EQ(copies_by_rank[0], 3);
  bench.scheduler.remove(b);
  bench.scheduler.remove(c);
  // The first prompt again: back to rank 0, its prefix from rank 0's host pages.
  RequestState* again = bench.add("again", 13, 0);
  bench.step();
  EXPECT_EQ(again->dp_rank, 0);
  EXPECT_EQ(again->cached_tokens, 12);
  EXPECT_EQ(bench.caches[0]->host_hit_tokens(), 12);
  // Its 3 pages loaded, after c's 3 cached pages went to the host to make room.
  EXPECT_EQ(copies_by_rank[0], 9);
  EXPECT_EQ(copies_by_rank[1], 0);
  EXPECT_EQ(tier.allocator().num_free(1), kPages);
}

// The live host tier over 2 ranks (page_size 4; 6 device and 4 offload
// pages per rank: device 0-5 and 6-11, offload 12-15 and 16-19).
TEST(DataParallelScheduler, TheLiveHostTierMovesPagesToTheirOwnRank) {
  SchedulerConfig config;
  config.page_size = 4;
  constexpr int64_t kDevice = 6, kOffload = 4;
  DpBench bench(kDevice, config, nullptr, kOffload);
  RequestState* a = bench.add("a", 20, 0);  // rank 0, 5 of its 6 pages
  RequestState* c = bench.add("c", 4, 1000);
  bench.step();
  ASSERT_EQ(a->dp_rank, 0);
  ASSERT_EQ(c->dp_rank, 1);
  RequestState* b = bench.add("b", 8, 2000);  // rank 0 has no room for it
  bench.step();
  ASSERT_EQ(b->dp_rank, 1);
  ASSERT_EQ(b->num_computed, 8);
  bench.scheduler.remove(a);  // a would outgrow rank 0's pages alone

  // Its 2 full pages move to rank 1's offload pages.
  std::vector<int32_t> moved_from, moved_to;
  const auto record = [&](std::span<const int32_t> device, std::span<const int32_t> offload) {
    moved_from.assign(device.begin(), device.end());
    moved_to.assign(offload.begin(), offload.end());
  };
  ASSERT_EQ(bench.scheduler.offload_pages(*b, 100, record), 2);
  EXPECT_EQ(moved_to, (std::vector<int32_t>{16, 17}));
  EXPECT_EQ(bench.allocator.num_used_offload(1), 2);
  EXPECT_EQ(bench.allocator.num_used_offload(0), 0);
  // Rank 1 copies both pairs with its own ids (its offload pages follow its
  // 6 device pages); rank 0 none.
  const RankPages layout = bench.allocator.layout();
  const RankPagePairs own = rank_page_pairs(moved_from, moved_to, layout, layout, 1);
  ASSERT_EQ(own.from.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(own.from[i], moved_from[i] - kDevice);
  EXPECT_EQ(own.to, (std::vector<int32_t>{6, 7}));
  EXPECT_TRUE(rank_page_pairs(moved_from, moved_to, layout, layout, 0).from.empty());
  // A copy from a device page of rank 0 to an offload page of rank 1 is refused.
  const std::vector<int32_t> zero = {0}, sixteen = {16};
  EXPECT_THROW(rank_page_pairs(zero, sixteen, layout, layout, 0), Error);

  // A step's sequence with those pages runs on rank 1, its pages local to
  // rank 1's cache.
  bench.step();
  ForwardBatch batch;
  const std::vector<int32_t> token = {1};
  SequenceInput in;
  in.tokens = token;
  in.start_position = 8;
  in.page_table = b->page_table;
  batch.sequences.push_back(in);
  const std::vector<int> ranks = sequence_ranks(batch, layout);
  ASSERT_EQ(ranks, std::vector<int>{1});
  RankBatch share;
  rank_share(batch, ranks, 1, layout, share);
  ASSERT_EQ(share.pages.size(), 1u);
  EXPECT_EQ(share.pages[0][0], 6);
  EXPECT_EQ(share.pages[0][1], 7);
  EXPECT_EQ(share.pages[0][2], b->page_table[2] - kDevice);
  // Pages of rank 0's offload range and rank 1's device range: refused.
  const std::vector<int32_t> mixed = {12, 7};
  batch.sequences[0].page_table = mixed;
  EXPECT_THROW(sequence_ranks(batch, layout), Error);

  // c and b grow on rank 1 until it is short of pages: b, its latest, is
  // parked with its offload pages.
  for (int i = 0; i < 40 && b->phase == RequestPhase::Running; ++i) bench.step();
  ASSERT_EQ(b->phase, RequestPhase::Waiting);
  ASSERT_EQ(bench.scheduler.num_parked(), 1);
  EXPECT_EQ(b->page_table, (std::vector<int32_t>{16, 17}));
  // Rank 0's request would get nothing from it; rank 1's does.
  EXPECT_EQ(bench.scheduler.drop_parked(10, 0), 0);
  EXPECT_EQ(b->page_table.size(), 2u);
  EXPECT_EQ(bench.scheduler.drop_parked(10, 1), 2);
  EXPECT_TRUE(b->page_table.empty());
  EXPECT_EQ(bench.allocator.num_free_offload(1), kOffload);
  bench.scheduler.check_integrity();
}

}  // namespace
}  // namespace megactx
