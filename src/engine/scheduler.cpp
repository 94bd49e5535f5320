#include "engine/scheduler.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace megactx {

Scheduler::Scheduler(SchedulerConfig config, PageAllocator& allocator, PrefixCache& prefix_cache)
    : Scheduler(config, allocator, std::vector<PrefixCache*>{&prefix_cache}) {}

Scheduler::Scheduler(SchedulerConfig config, PageAllocator& allocator,
                     std::vector<PrefixCache*> prefix_caches)
    : config_(config),
      page_size_(config.page_size),
      allocator_(allocator),
      prefix_caches_(std::move(prefix_caches)),
      admissions_(prefix_caches_.size(), 0) {
  MEGACTX_CHECK(config.max_running_requests > 0, "max_running_requests must be positive, got {}",
                config.max_running_requests);
  MEGACTX_CHECK(config.max_prefill_tokens > 0, "max_prefill_tokens must be positive, got {}",
                config.max_prefill_tokens);
  MEGACTX_CHECK(config.dp_admission_max_skips >= 0 && config.dp_admission_window >= 0,
                "dp_admission_max_skips ({}) and dp_admission_window ({}) must not be negative",
                config.dp_admission_max_skips, config.dp_admission_window);
  MEGACTX_CHECK(static_cast<int>(prefix_caches_.size()) == allocator.ranks(),
                "scheduler: {} prefix caches for {} data-parallel ranks", prefix_caches_.size(),
                allocator.ranks());
  for (const PrefixCache* cache : prefix_caches_)
    MEGACTX_CHECK(page_size_ == cache->page_size(), "scheduler and prefix cache page sizes differ");
  rank_limit_ = (config.max_running_requests + ranks() - 1) / ranks();
}

void Scheduler::enqueue(RequestState* request) {
  request->phase = RequestPhase::Waiting;
  waiting_.push_back(request);
}

int64_t Scheduler::available_pages() const {
  int64_t pages = 0;
  for (int rank = 0; rank < ranks(); ++rank) pages += available_pages(rank);
  return pages;
}

int64_t Scheduler::available_pages(int rank) const {
  return allocator_.num_free(rank) + prefix_caches_[static_cast<size_t>(rank)]->evictable_pages();
}

int64_t Scheduler::running_on(int rank) const {
  if (ranks() == 1) return static_cast<int64_t>(running_.size());
  return std::count_if(running_.begin(), running_.end(),
                       [rank](const RequestState* request) { return request->dp_rank == rank; });
}

int64_t Scheduler::running_tokens_on(int rank) const {
  int64_t tokens = 0;
  for (const RequestState* request : running_)
    if (ranks() == 1 || request->dp_rank == rank)
      tokens += static_cast<int64_t>(request->tokens.size());
  return tokens;
}

bool Scheduler::reserve_pages(RequestState& request, int64_t tokens) {
  const int64_t needed = pages_for(tokens);
  while (static_cast<int64_t>(request.page_table.size()) < needed) {
    std::optional<int32_t> page = allocator_.allocate(request.dp_rank);
    if (!page) {
      const int64_t missing = needed - static_cast<int64_t>(request.page_table.size());
      if (cache_of(request).evict(missing) == 0) return false;
      continue;
    }
    request.page_table.push_back(*page);
  }
  return true;
}

void Scheduler::release_pages(RequestState& request) {
  if (request.prefix_node == nullptr) {
    // A parked offloaded request holds offload pages without a lock.
    for (const int32_t page : request.page_table) allocator_.release(page);
    request.page_table.clear();
    request.num_computed = 0;
    request.latents_offloaded = false;
    return;
  }
  const int64_t verified = static_cast<int64_t>(request.tokens.size()) - request.num_draft_tokens;
  const int64_t full_pages = std::min(request.num_computed, verified) / page_size_;
  if (config_.enable_prefix_cache && request.shares_pages && !request.latents_offloaded &&
      full_pages > PrefixCache::depth(request.prefix_node)) {
    request.prefix_node = cache_of(request).insert(request.prefix_node, request.tokens,
                                                   request.page_table, full_pages);
  }
  cache_of(request).unlock(request.prefix_node);
  for (const int32_t page : request.page_table) allocator_.release(page);
  request.page_table.clear();
  request.prefix_node = nullptr;
  request.num_computed = 0;
  request.latents_offloaded = false;
}

void Scheduler::detach(RequestState& request, bool park) {
  if (!park || !request.latents_offloaded) {
    release_pages(request);
    return;
  }
  // Keep the leading offload pages (full, computed, verified: what
  // offload_pages moved); the device pages after them are recomputed.
  size_t kept = 0;
  while (kept < request.page_table.size() && allocator_.is_offload(request.page_table[kept])) {
    ++kept;
  }
  for (size_t i = kept; i < request.page_table.size(); ++i) {
    allocator_.release(request.page_table[i]);
  }
  request.page_table.resize(kept);
  request.num_computed = std::min(request.num_computed, static_cast<int64_t>(kept) * page_size_);
  if (request.prefix_node != nullptr) cache_of(request).unlock(request.prefix_node);
  request.prefix_node = nullptr;
  if (kept == 0) request.latents_offloaded = false;
}

std::pair<int64_t, int64_t> Scheduler::offload_candidates(const RequestState& request) const {
  const int64_t verified = static_cast<int64_t>(request.tokens.size()) - request.num_draft_tokens;
  const int64_t full_pages = std::min(request.num_computed, verified) / page_size_;
  // Offload pages are a prefix of the page table (moved first to last; a
  // parked request keeps that prefix): the candidates are the device pages
  // after it, found from the end, so a step with none costs O(1).
  int64_t first = full_pages;
  while (first > 0 && !allocator_.is_offload(request.page_table[static_cast<size_t>(first - 1)])) {
    --first;
  }
  return {first, full_pages};
}

int64_t Scheduler::offloadable_pages(const RequestState& request) const {
  const auto [first, full_pages] = offload_candidates(request);
  return full_pages - first;
}

int64_t Scheduler::drop_parked(int64_t pages, int rank) {
  int64_t freed = 0;
  for (auto it = waiting_.rbegin(); it != waiting_.rend() && freed < pages; ++it) {
    RequestState& request = **it;
    // Another rank's offload pages would not help (allocate_offload(rank)).
    if (!request.latents_offloaded || request.page_table.empty() || request.dp_rank != rank)
      continue;
    freed += static_cast<int64_t>(request.page_table.size());
    release_pages(request);  // parked: no prefix node, only offload pages
    ++dropped_parked_;
  }
  return freed;
}

int64_t Scheduler::offload_pages(
    RequestState& request, int64_t max_pages,
    const std::function<void(std::span<const int32_t>, std::span<const int32_t>)>& copy) {
  MEGACTX_CHECK(request.phase == RequestPhase::Running && request.prefix_node != nullptr,
                "offload of request {} that is not running", request.request.rid);
  const auto [first, full_pages] = offload_candidates(request);
  std::vector<int32_t> device, offload;
  for (int64_t i = first; i < full_pages && static_cast<int64_t>(device.size()) < max_pages; ++i) {
    // Its rank's: the rank that reads its pages holds their latents.
    const std::optional<int32_t> target = allocator_.allocate_offload(request.dp_rank);
    if (!target) break;
    device.push_back(request.page_table[static_cast<size_t>(i)]);
    offload.push_back(*target);
  }
  if (device.empty()) return 0;
  // Its pages leave the prefix cache's path: it locks only the root from now on.
  PrefixCache& prefix_cache = cache_of(request);
  if (request.prefix_node != prefix_cache.root()) {
    prefix_cache.lock(prefix_cache.root());
    prefix_cache.unlock(request.prefix_node);
    request.prefix_node = prefix_cache.root();
  }
  request.latents_offloaded = true;
  copy(device, offload);
  for (size_t i = 0; i < device.size(); ++i) {
    request.page_table[static_cast<size_t>(first) + i] = offload[i];
    allocator_.release(device[i]);
  }
  return static_cast<int64_t>(device.size());
}

int64_t Scheduler::prefix_limit(const RequestState& request) const {
  // At least the last token is computed (its logits give the next token);
  // input logprobs need the logits of the token before the first scored one.
  int64_t limit = static_cast<int64_t>(request.tokens.size()) - 1;
  if (request.wants_input_logprobs()) {
    limit = std::min(limit, std::max<int64_t>(request.request.logprob_start_len - 1, 0));
  }
  // Hidden states are kept per request, not per KV page: compute them all.
  if (request.request.return_hidden_states) limit = 0;
  return config_.enable_prefix_cache && limit >= page_size_ ? limit : 0;
}

bool Scheduler::choose_rank(RequestState& request, const std::vector<int64_t>& budget) const {
  const auto open = [&](int rank) {
    return budget[static_cast<size_t>(rank)] > 0 && running_on(rank) < rank_limit_;
  };
  // A parked request's offload pages are its rank's.
  if (ranks() == 1 || !request.page_table.empty()) return open(request.dp_rank);
  const int64_t limit = prefix_limit(request);
  const std::span<const int32_t> prefix(request.tokens.data(), static_cast<size_t>(limit));
  // A rank where its first chunk fits now first (as admission will check it,
  // from the prefix that rank caches), then the load-balance method's order
  // (DpLoadBalance; by default prefix-cache affinity, then the fewest running
  // requests), then the most free pages (a rank whose pages hold cached
  // prefixes has fewer), then the lowest rank.
  const DpLoadBalance method = config_.dp_load_balance;
  int best = -1;
  std::tuple<bool, int64_t, int64_t, int64_t> best_key;
  for (int rank = 0; rank < ranks(); ++rank) {
    if (!open(rank)) continue;
    const int64_t cached =
        limit > 0 ? prefix_caches_[static_cast<size_t>(rank)]->cached_prefix_tokens(prefix) : 0;
    const int64_t chunk = std::min(static_cast<int64_t>(request.tokens.size()) - cached,
                                   budget[static_cast<size_t>(rank)]);
    const int64_t on_rank = running_on(rank);
    // Its cached pages count as taken (a match locks them).
    const bool fits = on_rank == 0 || pages_for(cached + chunk) - cached / page_size_ + on_rank <=
                                          available_pages(rank) - cached / page_size_;
    int64_t first = 0, second = 0;  // larger is better
    switch (method) {
      case DpLoadBalance::CacheAware:
        first = cached;
        second = -on_rank;
        break;
      case DpLoadBalance::RoundRobin:  // the rank in turn first, then the ones after it
        first = -((rank - round_robin_next_ + ranks()) % ranks());
        break;
      case DpLoadBalance::ShortestQueue:
        first = -on_rank;
        break;
      case DpLoadBalance::MinimumTokens:
        first = -running_tokens_on(rank);
        break;
    }
    const std::tuple<bool, int64_t, int64_t, int64_t> key = {fits, first, second,
                                                             allocator_.num_free(rank)};
    if (best < 0 || key > best_key) {
      best = rank;
      best_key = key;
    }
  }
  if (best < 0) return false;
  request.dp_rank = best;
  return true;
}

void Scheduler::attach_prefix(RequestState& request) {
  PrefixCache& prefix_cache = cache_of(request);
  if (request.latents_offloaded) {
    // A parked request: its offload pages hold its first num_computed tokens.
    prefix_cache.lock(prefix_cache.root());
    request.prefix_node = prefix_cache.root();
    return;
  }
  // Its KV from here on is computed with the current weights.
  request.shares_pages = true;
  const int64_t limit = prefix_limit(request);
  if (limit == 0) {
    request.prefix_node = prefix_cache.root();
    request.num_computed = 0;
    return;
  }
  PrefixCache::Match match = prefix_cache.match(
      std::span<const int32_t>(request.tokens.data(), static_cast<size_t>(limit)));
  request.page_table = std::move(match.pages);
  request.prefix_node = match.node;
  request.num_computed = match.tokens;
}

int64_t Scheduler::fit_logit_rows(const RequestState& request, int64_t count, int64_t rows) const {
  if (rows < 1) return 0;
  if (!request.wants_input_logprobs()) return count;  // its last row only
  // Rows [low, end) of a chunk [start, end) when its scored positions begin at
  // low (plan_chunk), one row when they begin past it.
  const int64_t start = request.num_computed;
  const int64_t first = std::max<int64_t>(request.request.logprob_start_len, 1) - 1;
  const int64_t low = std::max(first, start);
  if (low > request.prompt_len - 2) return count;
  return std::min(count, low - start + rows);
}

void Scheduler::plan_chunk(RequestState& request, int64_t count, StepPlan& plan) {
  ScheduledChunk chunk;
  chunk.request = &request;
  chunk.start = request.num_computed;
  chunk.count = count;
  const int64_t end = chunk.start + count;
  const int64_t total = static_cast<int64_t>(request.tokens.size());
  chunk.samples = end == total && request.num_generated() < request.request.sampling.max_new_tokens;
  if (request.wants_input_logprobs()) {
    // Scored positions q in [max(s, 1), prompt_len) need the logits of q - 1.
    const int64_t first = std::max<int64_t>(request.request.logprob_start_len, 1) - 1;
    const int64_t last = request.prompt_len - 2;
    const int64_t low = std::max(first, chunk.start);
    const int64_t high = std::min(last, end - 1);
    if (low <= high) chunk.logits_from = low - chunk.start;
  }
  plan.chunks.push_back(chunk);
}

void Scheduler::preempt(RequestState* victim, bool park) {
  if (park && victim->latents_offloaded) ++parked_;
  detach(*victim, park);
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  victim->phase = RequestPhase::Waiting;
  // Input logprobs restart with the recomputation.
  if (!victim->input_logprobs_done) victim->input_logprobs.clear();
  ++victim->preemptions;
  ++preemptions_;
  waiting_.push_front(victim);
}

void Scheduler::retract_all() {
  // Latest admitted first, so the queue keeps their admission order.
  while (!running_.empty()) preempt(running_.back(), /*park=*/false);
}

void Scheduler::schedule(StepPlan& plan) {
  plan.chunks.clear();
  plan.preempted.clear();
  plan.prefill_tokens = 0;
  plan.decode_tokens = 0;
  // Prefill tokens per rank (one rank without data-parallel attention).
  std::vector<int64_t> budget(static_cast<size_t>(ranks()), config_.max_prefill_tokens);
  // Logits rows: every decode row first (1 + k with drafts), so that no
  // prefill chunk planned earlier in the loop leaves a decode without its rows.
  int64_t logit_rows =
      config_.max_logit_rows > 0 ? config_.max_logit_rows : std::numeric_limits<int64_t>::max();
  for (const RequestState* request : running_) {
    const int64_t remaining = static_cast<int64_t>(request->tokens.size()) - request->num_computed;
    if (remaining > 0 && remaining <= 1 + request->num_draft_tokens) logit_rows -= remaining;
  }
  MEGACTX_CHECK(logit_rows >= 0, "scheduler: the decode rows exceed max_logit_rows {}",
                config_.max_logit_rows);
  // The latest admitted running request of `rank` (the preemption victim).
  const auto last_on = [this](int rank) {
    return *std::find_if(running_.rbegin(), running_.rend(),
                         [rank](const RequestState* r) { return r->dp_rank == rank; });
  };

  // (1) Running requests, oldest first; victims are taken from the back.
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestState* request = running_[i];
    const int rank = request->dp_rank;
    int64_t& rank_budget = budget[static_cast<size_t>(rank)];
    const int64_t remaining = static_cast<int64_t>(request->tokens.size()) - request->num_computed;
    if (remaining <= 0) continue;
    // Decode: the last token, plus drafts to verify (1 + k).
    const bool decode = remaining <= 1 + request->num_draft_tokens;
    int64_t count =
        decode ? remaining : fit_logit_rows(*request, std::min(remaining, rank_budget), logit_rows);
    if (count == 0) continue;
    bool preempted_self = false;
    while (!reserve_pages(*request, request->num_computed + count)) {
      const int64_t on_rank = running_on(rank);
      if (on_rank == 1 && !decode) {
        // Alone and short of device pages: a request longer than they hold,
        // whose full pages move to the live host tier after every step,
        // prefills what its pages hold now.
        const int64_t fit =
            static_cast<int64_t>(request->page_table.size()) * page_size_ - request->num_computed;
        if (fit > 0 && fit < count) {
          count = fit;
          continue;
        }
      }
      // Only the rank's own requests hold its pages.
      RequestState* victim = last_on(rank);
      // Cannot happen: submit() caps every request at the KV capacity (of a rank).
      MEGACTX_CHECK(on_rank > 1, "request {} does not fit in the KV cache alone",
                    request->request.rid);
      plan.preempted.push_back(victim);
      preempt(victim, /*park=*/true);
      if (victim == request) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) {
      // Every later request of its rank went before it; other ranks' later
      // requests (data-parallel attention) now start at index i.
      --i;
      continue;
    }
    plan_chunk(*request, count, plan);
    if (decode) {
      plan.decode_tokens += count;
    } else {
      plan.prefill_tokens += count;
      rank_budget -= count;
      logit_rows -= plan.chunks.back().logits_rows();
    }
  }

  // (2) Admission while the budget, the batch limit and the pages allow: in
  // queue order, with one rank up to the first request that does not fit;
  // with data-parallel attention past requests that fit no rank, within the
  // bounds of the header's rule.
  std::vector<RequestState*> passed;  // fit no rank, passed over since the last admission
  int64_t window = config_.dp_admission_window;
  size_t next = 0;
  while (next < waiting_.size() && logit_rows > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_running_requests) {
    RequestState* request = waiting_[next];
    if (try_admit(*request, budget, logit_rows, plan)) {
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
      // Each is counted once per step: it is considered once per step.
      for (RequestState* skipped : passed) ++skipped->admission_skips;
      passed.clear();
      continue;
    }
    if (ranks() == 1 || window == 0 || request->admission_skips >= config_.dp_admission_max_skips ||
        !any_rank_open(budget)) {
      break;
    }
    --window;
    passed.push_back(request);
    ++next;
  }
}

bool Scheduler::any_rank_open(const std::vector<int64_t>& budget) const {
  for (int rank = 0; rank < ranks(); ++rank) {
    if (budget[static_cast<size_t>(rank)] > 0 && running_on(rank) < rank_limit_) return true;
  }
  return false;
}

bool Scheduler::try_admit(RequestState& request, std::vector<int64_t>& budget, int64_t& logit_rows,
                          StepPlan& plan) {
  if (request.prefix_node == nullptr) {
    if (!choose_rank(request, budget)) return false;
    attach_prefix(request);
  }
  const int rank = request.dp_rank;
  int64_t& rank_budget = budget[static_cast<size_t>(rank)];
  const int64_t on_rank = running_on(rank);
  const int64_t remaining = static_cast<int64_t>(request.tokens.size()) - request.num_computed;
  int64_t count = fit_logit_rows(request, std::min(remaining, rank_budget), logit_rows);
  if (on_rank == 0) {
    // Nothing else runs: at most what the device pages hold (a prompt
    // longer than they hold goes on in later steps, its full pages moved
    // to the live host tier in between).
    const int64_t room =
        (static_cast<int64_t>(request.page_table.size()) + available_pages(rank)) * page_size_ -
        request.num_computed;
    if (room > 0) count = std::min(count, room);
  }
  const int64_t needed =
      pages_for(request.num_computed + count) - static_cast<int64_t>(request.page_table.size());
  // Keep a page of headroom per running request so decodes rarely preempt.
  const bool fits = on_rank == 0 || needed + on_rank <= available_pages(rank);
  if (count == 0 || !fits || !reserve_pages(request, request.num_computed + count)) {
    detach(request, /*park=*/true);
    return false;
  }
  request.phase = RequestPhase::Running;
  request.admit_order = next_admit_order_++;
  if (ranks() > 1) round_robin_next_ = (rank + 1) % ranks();
  request.admission_skips = 0;
  ++admissions_[static_cast<size_t>(rank)];
  if (!request.admitted_once) {
    request.admitted_once = true;
    request.cached_tokens = request.num_computed;
  }
  running_.push_back(&request);
  plan_chunk(request, count, plan);
  plan.prefill_tokens += count;
  rank_budget -= count;
  logit_rows -= plan.chunks.back().logits_rows();
  return true;
}

void Scheduler::commit(const StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    RequestState& request = *chunk.request;
    request.num_computed = chunk.start + chunk.count;
    if (!config_.enable_prefix_cache || !request.shares_pages || request.latents_offloaded)
      continue;
    const int64_t verified = static_cast<int64_t>(request.tokens.size()) - request.num_draft_tokens;
    const int64_t full_pages = std::min(request.num_computed, verified) / page_size_;
    if (full_pages > PrefixCache::depth(request.prefix_node)) {
      request.prefix_node = cache_of(request).insert(request.prefix_node, request.tokens,
                                                     request.page_table, full_pages);
    }
  }
}

void Scheduler::remove(RequestState* request) {
  // Out of the queues first: even if releasing fails the request is gone.
  if (auto it = std::find(running_.begin(), running_.end(), request); it != running_.end()) {
    running_.erase(it);
  }
  if (auto it = std::find(waiting_.begin(), waiting_.end(), request); it != waiting_.end()) {
    waiting_.erase(it);
  }
  request->phase = RequestPhase::Finished;
  release_pages(*request);
}

void Scheduler::truncate(RequestState& request, int64_t length) {
  MEGACTX_CHECK(request.phase == RequestPhase::Running && request.prefix_node != nullptr,
                "truncate of request {} that is not running", request.request.rid);
  MEGACTX_CHECK(
      length >= request.prompt_len && length <= static_cast<int64_t>(request.tokens.size()),
      "truncate of request {} to {} tokens (prompt {}, now {})", request.request.rid, length,
      request.prompt_len, request.tokens.size());
  MEGACTX_CHECK(length >= PrefixCache::depth(request.prefix_node) * page_size_,
                "truncate of request {} into its shared prefix", request.request.rid);
  const auto dropped = static_cast<int64_t>(request.tokens.size()) - length;
  request.tokens.resize(static_cast<size_t>(length));
  request.num_draft_tokens = std::max<int64_t>(request.num_draft_tokens - dropped, 0);
  request.num_computed = std::min(request.num_computed, length);
  const int64_t keep = pages_for(request.num_computed);
  while (static_cast<int64_t>(request.page_table.size()) > keep) {
    allocator_.release(request.page_table.back());
    request.page_table.pop_back();
  }
}

void Scheduler::check_integrity() const {
  std::vector<int32_t> holders(static_cast<size_t>(allocator_.num_pages()), 0);
  // Each rank's tree checks the locks of its own requests.
  std::vector<std::unordered_map<const PrefixCache::Node*, int64_t>> locks(prefix_caches_.size());
  std::unordered_map<const RequestState*, int> seen;
  MEGACTX_CHECK(static_cast<int64_t>(running_.size()) <= config_.max_running_requests,
                "integrity: {} running requests over the limit {}", running_.size(),
                config_.max_running_requests);
  for (const RequestState* request : running_) {
    MEGACTX_CHECK(++seen[request] == 1, "integrity: request {} scheduled twice",
                  request->request.rid);
    MEGACTX_CHECK(request->phase == RequestPhase::Running,
                  "integrity: running request {} in phase {}", request->request.rid,
                  static_cast<int>(request->phase));
    MEGACTX_CHECK(request->prefix_node != nullptr,
                  "integrity: running request {} has no prefix node", request->request.rid);
    MEGACTX_CHECK(
        request->num_computed <= static_cast<int64_t>(request->tokens.size()) &&
            static_cast<int64_t>(request->page_table.size()) >= pages_for(request->num_computed),
        "integrity: request {} computed {} of {} tokens with {} pages", request->request.rid,
        request->num_computed, request->tokens.size(), request->page_table.size());
    const std::vector<int32_t> path = cache_of(*request).path_pages(request->prefix_node);
    MEGACTX_CHECK(path.size() <= request->page_table.size() &&
                      std::equal(path.begin(), path.end(), request->page_table.begin()) &&
                      static_cast<int64_t>(path.size()) * page_size_ <= request->num_computed,
                  "integrity: request {} page table disagrees with its cached prefix",
                  request->request.rid);
    bool device_seen = false;  // offload pages only before the first device page
    for (const int32_t page : request->page_table) {
      MEGACTX_CHECK(page >= 0 && page < allocator_.num_pages(), "integrity: bad page {}", page);
      const bool offload = allocator_.is_offload(page);
      MEGACTX_CHECK(allocator_.rank_of(page) == request->dp_rank,
                    "integrity: request {} of data-parallel rank {} holds page {} of rank {}",
                    request->request.rid, request->dp_rank, page, allocator_.rank_of(page));
      MEGACTX_CHECK(!offload || (request->latents_offloaded && !device_seen),
                    "integrity: request {} holds offload page {} without offloading or after a "
                    "device page",
                    request->request.rid, page);
      device_seen = device_seen || !offload;
      ++holders[static_cast<size_t>(page)];
    }
    ++locks[static_cast<size_t>(request->dp_rank)][request->prefix_node];
  }
  for (const RequestState* request : waiting_) {
    MEGACTX_CHECK(++seen[request] == 1, "integrity: request {} queued twice", request->request.rid);
    // A parked offloaded request keeps its offload pages, and nothing else.
    const bool parked = request->latents_offloaded && !request->page_table.empty();
    MEGACTX_CHECK(request->phase == RequestPhase::Waiting && request->prefix_node == nullptr &&
                      request->num_computed ==
                          static_cast<int64_t>(request->page_table.size()) * page_size_ &&
                      (parked || request->page_table.empty()),
                  "integrity: waiting request {} holds cache state", request->request.rid);
    for (const int32_t page : request->page_table) {
      MEGACTX_CHECK(allocator_.is_offload(page) && page < allocator_.num_pages(),
                    "integrity: parked request {} holds device page {}", request->request.rid,
                    page);
      // Admission brings it back to this rank (choose_rank).
      MEGACTX_CHECK(allocator_.rank_of(page) == request->dp_rank,
                    "integrity: parked request {} of data-parallel rank {} holds offload page {} "
                    "of rank {}",
                    request->request.rid, request->dp_rank, page, allocator_.rank_of(page));
      ++holders[static_cast<size_t>(page)];
    }
  }
  const std::vector<int32_t> request_holders = holders;
  if (ranks() == 1) {
    prefix_caches_[0]->check_integrity(holders, locks[0]);
  } else {
    // The ranks' trees share one host tier (if any): its pages are checked once.
    std::vector<int32_t> tier_holders;
    for (size_t rank = 0; rank < prefix_caches_.size(); ++rank)
      prefix_caches_[rank]->check_integrity(holders, locks[rank], &tier_holders);
    if (HostKvTier* tier = prefix_caches_[0]->host_tier()) {
      tier_holders.resize(static_cast<size_t>(tier->num_pages()), 0);
      tier->allocator().check_integrity(tier_holders);
    }
  }
  for (size_t page = 0; page < holders.size(); ++page) {
    const bool in_tree = holders[page] > request_holders[page];
    MEGACTX_CHECK(in_tree || request_holders[page] <= 1,
                  "integrity: private KV page {} is in {} page tables", page,
                  request_holders[page]);
    MEGACTX_CHECK(!in_tree || !allocator_.is_offload(static_cast<int32_t>(page)),
                  "integrity: offload page {} is in the prefix cache", page);
  }
  allocator_.check_integrity(holders);
}

}  // namespace megactx
