// What the scheduler tests share: a hand-made request (`prompt_len` token
// ids from `base`, base + i % 1000, so two requests with one base share a
// prefix, generating without a limit), its enqueueing, and one step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/request_state.h"
#include "engine/scheduler.h"

namespace megactx {

inline std::unique_ptr<RequestState> scheduler_request(const std::string& rid, int64_t prompt_len,
                                                       int32_t base) {
  auto request = std::make_unique<RequestState>();
  request->request.rid = rid;
  for (int64_t i = 0; i < prompt_len; ++i)
    request->tokens.push_back(base + static_cast<int32_t>(i % 1000));
  request->prompt_len = prompt_len;
  request->request.sampling.max_new_tokens = 1 << 20;
  return request;
}

// Enqueues scheduler_request(rid, prompt_len, base), kept alive in `owned`.
inline RequestState* enqueue_request(Scheduler& scheduler,
                                     std::vector<std::unique_ptr<RequestState>>& owned,
                                     const std::string& rid, int64_t prompt_len, int32_t base) {
  owned.push_back(scheduler_request(rid, prompt_len, base));
  scheduler.enqueue(owned.back().get());
  return owned.back().get();
}

// One scheduler step; every sampled chunk appends token 7; the scheduler's
// integrity checked after it.
inline StepPlan scheduler_step(Scheduler& scheduler) {
  StepPlan plan;
  scheduler.schedule(plan);
  scheduler.commit(plan);
  for (const ScheduledChunk& chunk : plan.chunks)
    if (chunk.samples) chunk.request->tokens.push_back(7);
  scheduler.check_integrity();
  return plan;
}

}  // namespace megactx
