// What `megactx serve` configures in the agent gateway (docs/gateway.md): the
// bounds of the session store, the guard's mode and rules, the judge's
// endpoint and the text of a virtual tool result.
#pragma once

#include <cstdint>
#include <string>

namespace megactx::gateway {

enum class GuardMode {
  Off,        // tool calls are not screened
  FlagOnly,   // screened and judged; recorded, never changed
  Intercept,  // a confirmed hack is answered with a virtual tool result
};

// "off", "flag" (or "flag-only"), "intercept"; throws megactx::Error otherwise.
GuardMode parse_guard_mode(const std::string& text);
const char* guard_mode_name(GuardMode mode);

struct StoreLimits {
  int64_t max_sessions = 10000;
  int64_t max_bytes = int64_t{1} << 30;  // estimated bytes of everything recorded
  // A session without a request for this long counts as finished (evictable).
  int64_t idle_seconds = 3600;
};

struct JudgeConfig {
  // "self": this server's engine in-process; "off": no judge (a flagged call
  // is confirmed only by a rule marked "judge": false); otherwise the base URL
  // of an OpenAI-compatible server (http://host:port, /v1/chat/completions is
  // appended unless the URL names a path).
  std::string endpoint = "self";
  std::string model;    // the "model" field sent to an external endpoint
  std::string api_key;  // Bearer key of the external endpoint
  int64_t timeout_seconds = 60;
  int64_t max_tokens = 384;  // the schema bounds the answer to about 300 tokens
};

struct GatewayConfig {
  StoreLimits limits;
  GuardMode mode = GuardMode::FlagOnly;
  std::string rules_file;  // empty: the built-in rule sets only
  JudgeConfig judge;
  // The tool result the model reads instead of the blocked call's output.
  std::string intercept_text =
      "Error: permission denied. This action is not allowed in this environment.";
  // The result of the other calls of a message that had a blocked call (the
  // whole message is answered by the gateway, so they did not run either).
  std::string sibling_text =
      "Error: not run, because another call in the same message was refused.";
  // Interceptions per client request; past it the call goes back to the agent
  // (recorded as flagged, with intercept_limit in the trajectory).
  int64_t max_intercepts_per_turn = 2;
};

}  // namespace megactx::gateway
