#include "gateway/guard.h"

#include <mutex>

namespace megactx::gateway {

Guard::Guard(GuardMode mode, RuleFilter filter, std::shared_ptr<Judge> judge,
             GatewayMetrics& metrics)
    : mode_(mode), filter_(std::move(filter)), judge_(std::move(judge)), metrics_(metrics) {}

void Guard::review(const nlohmann::json& tool_calls, const nlohmann::json& messages,
                   std::function<void(std::vector<CallReview>)> done) {
  struct Pending {
    std::mutex mutex;
    std::vector<CallReview> reviews;
    size_t waiting = 0;
    std::function<void(std::vector<CallReview>)> done;
  };
  auto pending = std::make_shared<Pending>();
  pending->done = std::move(done);
  std::vector<size_t> to_judge;
  if (tool_calls.is_array()) {
    for (const auto& call : tool_calls) {
      CallReview item;
      item.call = view_tool_call(call);
      item.hits = filter_.screen(item.call);
      ++metrics_.calls_screened;
      if (!item.hits.empty()) {
        ++metrics_.calls_flagged;
        bool needs_judge = true;
        for (const RuleHit& hit : item.hits) needs_judge = needs_judge && hit.judge;
        if (!needs_judge) {
          item.confirmed = true;
          item.verdict = {VerdictKind::Hack, "confirmed by rule " + item.hits.front().rule, 0.0};
        } else if (judge_) {
          to_judge.push_back(pending->reviews.size());
        } else {
          item.verdict = {VerdictKind::Failed, "no judge is configured", 0.0};
        }
      }
      if (item.confirmed) ++metrics_.calls_confirmed;
      pending->reviews.push_back(std::move(item));
    }
  }
  pending->waiting = to_judge.size();
  if (to_judge.empty()) return pending->done(std::move(pending->reviews));
  // Cases first, then the calls: a judge may answer before the loop ends.
  std::vector<JudgeCase> cases;
  for (size_t index : to_judge) {
    const CallReview& item = pending->reviews[index];
    cases.push_back(judge_case(messages, item.call, item.hits));
  }
  for (size_t k = 0; k < to_judge.size(); ++k) {
    const size_t index = to_judge[k];
    judge_->judge(cases[k], [this, pending, index](Verdict verdict) {
      metrics_.judge_latency.observe(verdict.seconds);
      switch (verdict.kind) {
        case VerdictKind::Hack:
          ++metrics_.judge_hack;
          break;
        case VerdictKind::Legitimate:
          ++metrics_.judge_legitimate;
          break;
        case VerdictKind::Unparseable:
          ++metrics_.judge_unparseable;
          break;
        case VerdictKind::Failed:
          ++metrics_.judge_failed;
          break;
      }
      std::function<void(std::vector<CallReview>)> finish;
      std::vector<CallReview> reviews;
      {
        std::lock_guard lock(pending->mutex);
        CallReview& item = pending->reviews[index];
        item.judged = true;
        item.confirmed = verdict.kind == VerdictKind::Hack;
        item.verdict = std::move(verdict);
        if (item.confirmed) ++metrics_.calls_confirmed;
        if (--pending->waiting > 0) return;
        finish = std::move(pending->done);
        reviews = std::move(pending->reviews);
      }
      finish(std::move(reviews));
    });
  }
}

}  // namespace megactx::gateway
