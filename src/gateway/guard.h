// The anti-reward-hacker: every tool call a gateway session's model emits is
// screened by the rule filter (recall); a flagged call goes to the judge
// (precision) unless a rule that fired is marked "judge": false, which
// confirms it as it is. What a confirmed call leads to (flag only, or a
// virtual tool result) is the turn's business (session_turn.h).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "gateway/gateway_config.h"
#include "gateway/gateway_metrics.h"
#include "gateway/judge.h"
#include "gateway/rule_filter.h"

namespace megactx::gateway {

struct CallReview {
  ToolCallView call;
  std::vector<RuleHit> hits;
  bool judged = false;
  Verdict verdict;
  bool confirmed = false;
};

class Guard {
 public:
  // `judge` null: no judge (only rules without judge confirm).
  Guard(GuardMode mode, RuleFilter filter, std::shared_ptr<Judge> judge, GatewayMetrics& metrics);

  GuardMode mode() const { return mode_; }
  const RuleFilter& filter() const { return filter_; }
  Judge* judge() const { return judge_.get(); }

  // Screens `tool_calls` (OpenAI's list) in the context of `messages` (the
  // request's, for the judge); `done` gets one review per call, once, after
  // every verdict (possibly on the caller's thread when nothing was flagged).
  void review(const nlohmann::json& tool_calls, const nlohmann::json& messages,
              std::function<void(std::vector<CallReview>)> done);

 private:
  GuardMode mode_;
  RuleFilter filter_;
  std::shared_ptr<Judge> judge_;
  GatewayMetrics& metrics_;
};

}  // namespace megactx::gateway
