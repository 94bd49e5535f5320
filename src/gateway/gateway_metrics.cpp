#include "gateway/gateway_metrics.h"

#include <fmt/format.h>

namespace megactx::gateway {

namespace {

std::string scalar(const std::string& name, const char* type, const char* help, double value) {
  return fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

}  // namespace

GatewayMetrics::GatewayMetrics()
    : judge_latency({0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0}) {}

void GatewayMetrics::count_turn(const std::string& kind) {
  if (kind == "start")
    ++turns_start;
  else if (kind == "append")
    ++turns_append;
  else if (kind == "realign")
    ++turns_realign;
  else if (kind == "fork")
    ++turns_fork;
  else
    ++turns_compaction;
}

std::string GatewayMetrics::render(const StoreStats& store) const {
  std::string out;
  auto counter = [&](const char* name, const char* help, const std::atomic<uint64_t>& value) {
    out += scalar(name, "counter", help, static_cast<double>(value.load()));
  };
  counter("megactx_gateway_tool_calls_screened_total",
          "Tool calls of gateway sessions the guard screened.", calls_screened);
  counter("megactx_gateway_tool_calls_flagged_total", "Screened tool calls a rule flagged.",
          calls_flagged);
  counter("megactx_gateway_tool_calls_confirmed_total",
          "Flagged tool calls confirmed as reward hacking (judge, or a rule without judge).",
          calls_confirmed);
  counter("megactx_gateway_tool_calls_intercepted_total",
          "Confirmed tool calls answered with a virtual tool result instead of the agent.",
          calls_intercepted);
  out +=
      "# HELP megactx_gateway_judge_verdicts_total Judge answers by verdict.\n"
      "# TYPE megactx_gateway_judge_verdicts_total counter\n";
  out += fmt::format("megactx_gateway_judge_verdicts_total{{verdict=\"hack\"}} {}\n",
                     judge_hack.load());
  out += fmt::format("megactx_gateway_judge_verdicts_total{{verdict=\"legitimate\"}} {}\n",
                     judge_legitimate.load());
  out += fmt::format("megactx_gateway_judge_verdicts_total{{verdict=\"unparseable\"}} {}\n",
                     judge_unparseable.load());
  out += fmt::format("megactx_gateway_judge_verdicts_total{{verdict=\"error\"}} {}\n",
                     judge_failed.load());
  out += judge_latency.render("megactx_gateway_judge_latency_seconds",
                              "Time from asking the judge to its verdict.");
  out +=
      "# HELP megactx_gateway_turns_total Session turns by how they matched the history.\n"
      "# TYPE megactx_gateway_turns_total counter\n";
  for (const auto& [kind, value] :
       {std::pair{"start", &turns_start}, std::pair{"append", &turns_append},
        std::pair{"realign", &turns_realign}, std::pair{"fork", &turns_fork},
        std::pair{"compaction", &turns_compaction}})
    out += fmt::format("megactx_gateway_turns_total{{kind=\"{}\"}} {}\n", kind, value->load());
  counter("megactx_gateway_turns_failed_total",
          "Session turns the engine failed (answered with an error, not recorded).", turns_failed);
  out += scalar("megactx_gateway_sessions", "gauge", "Sessions in the gateway's store.",
                static_cast<double>(store.sessions));
  out += scalar("megactx_gateway_store_bytes", "gauge",
                "Estimated bytes of everything the session store holds.",
                static_cast<double>(store.bytes));
  out += scalar("megactx_gateway_sessions_evicted_total", "counter",
                "Finished or idle sessions evicted to keep the store within its bounds.",
                static_cast<double>(store.evicted));
  out += scalar("megactx_gateway_store_rejections_total", "counter",
                "Requests refused (503) because active sessions filled the store.",
                static_cast<double>(store.rejected));
  return out;
}

}  // namespace megactx::gateway
