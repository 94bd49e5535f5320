// Scheduler: continuous batching over the paged KV cache.
//
// Every step: (1) every running request gets its tokens: decode requests one
// (1 + k when verifying k drafts), requests still prefilling the next chunk
// within the step's prefill budget; a request that needs a page it cannot get
// (after evicting unlocked prefix-cache pages) preempts the most recently
// admitted running request (recompute: its pages are cached and freed, and it
// goes back to the front of the queue with its generated tokens as prompt
// continuation; with a host KV tier its full pages may wait in host memory
// and come back when it is admitted again). (2) Waiting requests are admitted in FIFO order while
// the prefill budget, max_running_requests and the free pages allow, starting from their longest
// cached prefix (with data-parallel attention past requests that fit no rank, bounded: below).
//
// The live host tier (offload pages, kv_cache.h): offload_pages() moves a
// request's full pages (prefilled or decoded) to pages whose latents live in
// host memory. Such a request no longer shares pages with the prefix cache (it
// locks only the root), and a preemption for device pages parks it: its
// offload pages stay with it in the queue, only its device pages (the tail)
// are given back and recomputed. A request alone with too few device pages
// for its next chunk gets a shorter chunk (its full pages move between
// steps), so a prompt longer than the device pages hold prefills into the
// tier; drop_parked() takes parked requests' offload pages back when a
// running one must move. With data-parallel attention the offload pages are
// per rank too (cache/rank_pages.h): a request moves to its own rank's, a
// parked one keeps its rank, and only the parked requests of a rank give
// theirs up to a request of that rank.
//
// Data-parallel attention (an allocator of several ranks, one prefix cache
// per rank): every request runs on one rank while admitted, all its pages
// from that rank's range. Admission pins it to a rank where its first chunk
// fits now, among those to the one whose prefix cache holds the longest
// prefix of it, else the one with the fewest running requests, then the most
// free pages. The prefill budget and the running limit
// (max_running_requests / ranks, rounded up) are per rank, and a rank short
// of pages preempts its own latest request. The logit rows of a step stay
// one budget (they are all read on one process).
//
// Admission with data-parallel attention looks past a request that fits no
// rank now (a long prompt while every rank is busy): it stays where it is in
// the queue and later requests that fit some rank are admitted this step (a
// short one need not wait behind it for pages it cannot use). Two bounds:
// at most dp_admission_window requests are passed over in one step (so a long
// queue costs bounded work per step), and a request passed over in
// dp_admission_max_skips steps (steps in which a later request was admitted
// while it waited) stops admission there until it fits, as the head of the
// queue always did with one rank: then only running requests finishing and
// older requests ahead of it take pages, so it cannot starve (submit() caps
// every request at one rank's pages). The count starts again at each
// admission, so a preempted request gets the same bound when it waits again.
// With one rank admission stays FIFO: the first request that does not fit
// ends it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "cache/page_allocator.h"
#include "cache/prefix_cache.h"
#include "engine/dp_load_balance.h"
#include "engine/request_state.h"

namespace megactx {

struct SchedulerConfig {
  int64_t max_running_requests = 256;
  int64_t max_prefill_tokens = 8192;
  int64_t page_size = 64;
  bool enable_prefix_cache = true;
  // Rows of logits per step (0: no limit; EngineConfig::max_logit_rows). Every
  // chunk takes at least one row, a scoring chunk one per scored position;
  // decode rows are set aside first, prefill chunks are cut to what is left.
  int64_t max_logit_rows = 0;
  // Data-parallel attention only (see above): the steps a waiting request
  // that fits no rank may be passed over before admission stops at it (0:
  // FIFO, as with one rank), and the most requests passed over in one step.
  int64_t dp_admission_max_skips = 32;
  int64_t dp_admission_window = 64;
  DpLoadBalance dp_load_balance = DpLoadBalance::CacheAware;
};

struct ScheduledChunk {
  RequestState* request = nullptr;
  int64_t start = 0;         // first new position (== tokens already in the cache)
  int64_t count = 0;         // new tokens
  int64_t logits_from = -1;  // as SequenceInput::logits_from
  bool samples = false;      // the chunk reaches the end of the sequence: sample the next token
  // Rows of the forward's logits this chunk gets (logits_from on, or its last).
  int64_t logits_rows() const { return logits_from >= 0 ? count - logits_from : 1; }
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<RequestState*> preempted;  // this step, already requeued
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, PageAllocator& allocator, PrefixCache& prefix_cache);
  // Data-parallel attention: `prefix_caches[r]` holds rank r's pages (one per
  // allocator rank).
  Scheduler(SchedulerConfig config, PageAllocator& allocator,
            std::vector<PrefixCache*> prefix_caches);

  void enqueue(RequestState* request);
  // Plans one step and reserves its pages. Leaves running requests in `plan`
  // order; call commit() after the forward pass.
  void schedule(StepPlan& plan);
  // After the forward: advances num_computed and shares newly full pages.
  void commit(const StepPlan& plan);
  // Takes a finished or aborted request out (its full pages stay cached).
  void remove(RequestState* request);
  // Rolls a running request back to its first `length` tokens (rejected
  // drafts): the KV of later positions is forgotten and pages past the new
  // end go back to the allocator. Never reaches into shared prefix pages.
  void truncate(RequestState& request, int64_t length);
  // Preempts every running request back to the front of the queue (their
  // full pages stay cached; offloaded ones are dropped, so that every
  // request recomputes with the weights of its resumption):
  // pause_generation's "retract".
  void retract_all();

  // The live host tier: moves up to `max_pages` of `request`'s full device
  // pages (computed and verified) to free offload pages, first to last.
  // `copy(device_pages, offload_pages)` copies their contents (before the
  // device pages can be reused: on the model's stream, or at once on the
  // host); then the request's references to the device pages go (pages the
  // prefix cache holds stay there, now unlocked). Returns the pages moved.
  int64_t offload_pages(
      RequestState& request, int64_t max_pages,
      const std::function<void(std::span<const int32_t>, std::span<const int32_t>)>& copy);
  // The full device pages offload_pages() would move now, offload pages permitting.
  int64_t offloadable_pages(const RequestState& request) const;
  // Frees offload pages of data-parallel rank `rank` for a running request
  // of that rank that must move its latents: parked requests of the rank,
  // last queued first, lose theirs (they recompute when admitted again)
  // until `pages` are free or none is parked. Returns the pages freed.
  int64_t drop_parked(int64_t pages, int rank = 0);

  const std::vector<RequestState*>& running() const { return running_; }
  const std::deque<RequestState*>& waiting() const { return waiting_; }
  int64_t num_preemptions() const { return preemptions_; }
  // Preemptions that parked an offloaded request (its latents stayed in host memory).
  int64_t num_parked() const { return parked_; }
  // Parked requests whose offload pages drop_parked() took.
  int64_t num_dropped_parked() const { return dropped_parked_; }
  // Pages that could be had now: free plus evictable (of every rank, or of one).
  int64_t available_pages() const;
  int64_t available_pages(int rank) const;
  // Data-parallel ranks: their running requests now, and admissions so far.
  int ranks() const { return static_cast<int>(prefix_caches_.size()); }
  int64_t running_on(int rank) const;
  // Tokens (prompt and output so far) of the running requests on `rank`.
  int64_t running_tokens_on(int rank) const;
  int64_t admissions(int rank) const { return admissions_[static_cast<size_t>(rank)]; }

  // Throws megactx::Error on any broken invariant of the allocator, the
  // prefix cache and the request page tables.
  void check_integrity() const;

 private:
  // [first, end) of the page table: the full device pages after its offload pages.
  std::pair<int64_t, int64_t> offload_candidates(const RequestState& request) const;
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }
  // Grows request's page table to cover `tokens` positions; false when no
  // page can be freed (nothing to evict).
  bool reserve_pages(RequestState& request, int64_t tokens);
  // Caches the full pages, frees the request's pages and unlocks its path.
  void release_pages(RequestState& request);
  // Preempts a running request to the front of the queue. `park`: an
  // offloaded request keeps its offload pages (otherwise everything goes).
  void preempt(RequestState* victim, bool park);
  // A request leaving the running set (preemption, failed admission): gives
  // back its lock and pages, but an offloaded request with `park` keeps its
  // leading offload pages and their tokens computed.
  void detach(RequestState& request, bool park);
  void plan_chunk(RequestState& request, int64_t count, StepPlan& plan);
  // The most of `count` new tokens of `request`'s next prefill chunk whose
  // logits rows fit in `rows` (0 when not even one row is left).
  int64_t fit_logit_rows(const RequestState& request, int64_t count, int64_t rows) const;
  // Starts a waiting request from its longest cached prefix.
  void attach_prefix(RequestState& request);
  // How much of the request's tokens may come from the prefix cache.
  int64_t prefix_limit(const RequestState& request) const;
  // Data-parallel attention: pins a waiting request to a rank with prefill
  // budget and room for one more request (false: none has).
  bool choose_rank(RequestState& request, const std::vector<int64_t>& budget) const;
  // Whether some rank has prefill budget and room for one more request.
  bool any_rank_open(const std::vector<int64_t>& budget) const;
  // Admits a waiting request (still in the queue) if its first chunk fits:
  // pins its rank, reserves its pages and plans the chunk, spending `budget`
  // and `logit_rows`. False leaves it waiting with no cache state but what it
  // came with (a parked request's offload pages).
  bool try_admit(RequestState& request, std::vector<int64_t>& budget, int64_t& logit_rows,
                 StepPlan& plan);
  PrefixCache& cache_of(const RequestState& request) const {
    return *prefix_caches_[static_cast<size_t>(request.dp_rank)];
  }

  SchedulerConfig config_;
  int64_t page_size_;
  PageAllocator& allocator_;
  std::vector<PrefixCache*> prefix_caches_;  // [ranks]
  int64_t rank_limit_ = 0;                   // running requests per rank
  int round_robin_next_ = 0;                 // DpLoadBalance::RoundRobin's next rank
  std::vector<int64_t> admissions_;          // [ranks]
  std::vector<RequestState*> running_;       // admission order
  std::deque<RequestState*> waiting_;
  int64_t next_admit_order_ = 0;
  int64_t preemptions_ = 0;
  int64_t parked_ = 0;
  int64_t dropped_parked_ = 0;
};

}  // namespace megactx
