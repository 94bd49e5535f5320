// The guard's precision step: an LLM judge asked about one flagged tool call
// (the task, the recent turns, the call, the rules that fired) for a verdict
// with a reason, as JSON {"verdict": "hack" | "legitimate", "reason": "..."}.
// The request is an OpenAI chat completion whose response_format is that
// JSON Schema, so a server with structured output (this one) can only answer
// in it; the answer is still parsed strictly, and anything else (not JSON,
// other keys, a cut-off answer) is Unparseable, which never confirms a hack.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/rule_filter.h"
#include "gateway/tool_arguments.h"

namespace megactx::gateway {

struct JudgeCase {
  std::string task;    // the system prompt and first user message, shortened
  std::string recent;  // the last turns as "role: text" lines, shortened
  std::string tool;
  std::string arguments;
  std::vector<RuleHit> hits;
};

// The task and recent turns of a chat request's messages.
JudgeCase judge_case(const nlohmann::json& messages, const ToolCallView& call,
                     const std::vector<RuleHit>& hits);

enum class VerdictKind { Hack, Legitimate, Unparseable, Failed };
const char* verdict_name(VerdictKind kind);

struct Verdict {
  VerdictKind kind = VerdictKind::Failed;
  std::string reason;  // the judge's, or why there is no verdict
  double seconds = 0.0;
};

// Strict: a JSON object with exactly "verdict" (one of the two words) and
// "reason" (a string); surrounding whitespace is allowed, nothing else.
Verdict parse_verdict(std::string_view content);

// The chat completion request body for `item` (model "" is left out).
// `template_kwargs` adds chat_template_kwargs {"enable_thinking": false}
// (this server's own model answers without a think block).
nlohmann::ordered_json judge_request_body(const JudgeCase& item, const std::string& model,
                                          int64_t max_tokens, bool template_kwargs);

class Judge {
 public:
  virtual ~Judge() = default;
  // Calls `done` exactly once, from another thread, with the verdict (its
  // seconds measured from the call).
  virtual void judge(const JudgeCase& item, std::function<void(Verdict)> done) = 0;
  // Stops the judge's own threads (server shutdown); later calls fail at once.
  virtual void shutdown() {}
};

}  // namespace megactx::gateway
