#include "engine/dp_load_balance.h"

#include "core/error.h"

namespace megactx {

DpLoadBalance parse_dp_load_balance(const std::string& name) {
  for (const DpLoadBalance method : {DpLoadBalance::CacheAware, DpLoadBalance::RoundRobin,
                                     DpLoadBalance::ShortestQueue, DpLoadBalance::MinimumTokens})
    if (name == dp_load_balance_name(method)) return method;
  fail(
      "unknown load-balance method '{}' (cache_aware, round_robin, shortest_queue or "
      "minimum_tokens)",
      name);
}

const char* dp_load_balance_name(DpLoadBalance method) {
  switch (method) {
    case DpLoadBalance::CacheAware:
      return "cache_aware";
    case DpLoadBalance::RoundRobin:
      return "round_robin";
    case DpLoadBalance::ShortestQueue:
      return "shortest_queue";
    case DpLoadBalance::MinimumTokens:
      return "minimum_tokens";
  }
  return "cache_aware";
}

}  // namespace megactx
