// The scheduler alone, on hand-made requests: the prefill budget, decode every
// step, the batch limit, admission by free pages, preemption order, and
// speculative-decoding rollback, with check_integrity() after every step.
#include <gtest/gtest.h>

#include <memory>

#include "core/error.h"
#include "engine/scheduler.h"
#include "scheduler_request.h"

namespace megactx {
namespace {

struct Bench {
  explicit Bench(int64_t pages, SchedulerConfig config = {})
      : allocator(pages), cache(allocator, config.page_size), scheduler(config, allocator, cache) {}

  RequestState* add(const std::string& rid, int64_t prompt_len, int32_t base = 0) {
    return enqueue_request(scheduler, requests, rid, prompt_len, base);
  }
  StepPlan step() { return scheduler_step(scheduler); }

  PageAllocator allocator;
  PrefixCache cache;
  Scheduler scheduler;
  std::vector<std::unique_ptr<RequestState>> requests;
};

TEST(Scheduler, ChunkedPrefillUnderTheBudgetWhileDecodesRunEveryStep) {
  SchedulerConfig config;
  config.max_prefill_tokens = 100;
  Bench bench(64, config);
  RequestState* short_request = bench.add("short", 10);
  RequestState* long_request = bench.add("long", 450, 5000);
  StepPlan first = bench.step();
  ASSERT_EQ(first.chunks.size(), 2u);
  EXPECT_EQ(first.chunks[0].count, 10);
  EXPECT_TRUE(first.chunks[0].samples);
  EXPECT_EQ(first.chunks[1].count, 90);  // the rest of the budget
  EXPECT_FALSE(first.chunks[1].samples);
  for (int step = 0; step < 3; ++step) {
    StepPlan plan = bench.step();
    ASSERT_EQ(plan.chunks.size(), 2u);
    EXPECT_EQ(plan.decode_tokens, 1);  // "short" decodes every step
    EXPECT_EQ(plan.prefill_tokens, 100);
  }
  StepPlan last = bench.step();  // 90 + 3 * 100 + 60 = 450
  ASSERT_EQ(last.chunks.size(), 2u);
  EXPECT_EQ(last.chunks[1].count, 60);
  EXPECT_TRUE(last.chunks[1].samples);
  EXPECT_EQ(long_request->num_computed, 450);
  EXPECT_EQ(short_request->tokens.size(), 15u);
}

// max_logit_rows: a scoring request (logits at every position from
// logprob_start_len on) is chunked so that no step asks for more logits rows
// than the limit, decode rows (1 + drafts) come first, and every chunk takes
// at least its last row.
TEST(Scheduler, ScoringChunksFitTheLogitRowsAndDecodesComeFirst) {
  SchedulerConfig config;
  config.max_prefill_tokens = 1000;
  config.max_logit_rows = 40;
  Bench bench(64, config);
  RequestState* decoder = bench.add("decoder", 10);
  bench.step();  // prefilled (one row), token 7 sampled
  ASSERT_EQ(decoder->num_computed, 10);
  // Scored from position 30 on: logits of positions 29..198 (prompt 200).
  RequestState* scored = bench.add("scored", 200, 3000);
  scored->request.return_logprob = true;
  scored->request.logprob_start_len = 30;
  scored->request.sampling.max_new_tokens = 0;
  // Three drafts on the decoder: 4 decode rows set aside first.
  for (int32_t d : {1, 2, 3}) decoder->tokens.push_back(d);
  decoder->num_draft_tokens = 3;
  StepPlan plan;
  bench.scheduler.schedule(plan);
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].count, 4);
  EXPECT_EQ(plan.chunks[1].request, scored);
  // Positions 0..28 need no logits; 29 onwards take the 36 rows left.
  EXPECT_EQ(plan.chunks[1].count, 29 + 36);
  EXPECT_EQ(plan.chunks[1].logits_from, 29);
  EXPECT_EQ(plan.chunks[1].logits_rows(), 36);
  bench.scheduler.commit(plan);
  // All three drafts rejected: back to 11 tokens, plus the bonus token.
  bench.scheduler.truncate(*decoder, 11);
  decoder->tokens.resize(11);
  decoder->tokens.push_back(7);
  decoder->num_draft_tokens = 0;
  bench.scheduler.check_integrity();
  int64_t steps = 1;
  while (scored->num_computed < 200) {
    StepPlan next = bench.step();
    int64_t rows = 0;
    for (const ScheduledChunk& chunk : next.chunks) rows += chunk.logits_rows();
    EXPECT_LE(rows, 40);
    ++steps;
    ASSERT_LT(steps, 20);
  }
  // 135 more rows at 39 a step (the decoder takes one): 4 more steps.
  EXPECT_EQ(steps, 5);
  // A request that wants no input logprobs takes one row however long its chunk.
  RequestState* plain = bench.add("plain", 300, 6000);
  StepPlan next = bench.step();
  ASSERT_EQ(next.chunks.back().request, plain);
  EXPECT_EQ(next.chunks.back().count, 300);
  EXPECT_EQ(next.chunks.back().logits_rows(), 1);
}

TEST(Scheduler, BatchLimitAndAdmissionByPages) {
  SchedulerConfig config;
  config.max_running_requests = 2;
  Bench bench(4, config);
  bench.add("a", 100);
  bench.add("b", 100, 2000);
  bench.add("c", 10, 4000);
  StepPlan plan = bench.step();
  // a takes 2 pages; b would need 2 more + 1 page of headroom for a. c would
  // fit (1 + 1), but with one rank admission stays FIFO: it waits behind b.
  EXPECT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(bench.scheduler.waiting().size(), 2u);
  bench.scheduler.remove(bench.requests[0].get());
  bench.scheduler.check_integrity();
  plan = bench.step();
  EXPECT_EQ(plan.chunks.size(), 2u);  // b and c now; the batch limit stops there
  EXPECT_EQ(bench.scheduler.running().size(), 2u);
}

TEST(Scheduler, PreemptsTheNewestRequestAndRequeuesItFirst) {
  Bench bench(3);
  RequestState* a = bench.add("a", 60);
  RequestState* b = bench.add("b", 60, 2000);
  RequestState* c = bench.add("c", 2, 4000);
  bench.step();  // a and b prefilled (1 page each); c waits for headroom
  EXPECT_EQ(bench.scheduler.running().size(), 2u);
  // Decode until a needs a second page while b holds the other; c got the third.
  int64_t steps = 0;
  while (bench.scheduler.num_preemptions() == 0 && steps++ < 200) bench.step();
  ASSERT_GT(bench.scheduler.num_preemptions(), 0);
  EXPECT_EQ(a->phase, RequestPhase::Running);  // the oldest is never the victim
  EXPECT_EQ(bench.scheduler.waiting().front()->phase, RequestPhase::Waiting);
  EXPECT_TRUE(bench.scheduler.waiting().front() == b || bench.scheduler.waiting().front() == c);
  EXPECT_TRUE(bench.scheduler.waiting().front()->page_table.empty());
}

TEST(Scheduler, DraftsAreDecodeTokensAndRollBack) {
  SchedulerConfig config;
  config.max_prefill_tokens = 64;
  Bench bench(8, config);
  RequestState* r = bench.add("r", 126);
  bench.step();
  bench.step();  // 126 computed in two chunks, token 7 sampled
  ASSERT_EQ(r->num_computed, 126);
  ASSERT_EQ(r->tokens.size(), 127u);
  // Three drafts to verify with the last token: 4 tokens, scheduled as decode.
  for (int32_t d : {1, 2, 3}) r->tokens.push_back(d);
  r->num_draft_tokens = 3;
  StepPlan plan;
  bench.scheduler.schedule(plan);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].count, 4);
  EXPECT_EQ(plan.decode_tokens, 4);
  bench.scheduler.commit(plan);
  EXPECT_EQ(r->num_computed, 130);
  EXPECT_EQ(r->page_table.size(), 3u);
  // The page holding drafts (positions 128..129) is not shared.
  EXPECT_EQ(PrefixCache::depth(r->prefix_node), 1);
  bench.scheduler.check_integrity();
  // First draft accepted, the others rejected: keep 128 tokens (+ bonus later).
  bench.scheduler.truncate(*r, 128);
  r->num_draft_tokens = 0;
  EXPECT_EQ(r->num_computed, 128);
  EXPECT_EQ(r->page_table.size(), 2u);
  bench.scheduler.check_integrity();
  EXPECT_THROW(bench.scheduler.truncate(*r, 10), Error);  // into the prompt
}

}  // namespace
}  // namespace megactx
