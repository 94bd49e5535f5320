// How data-parallel attention pins a new request to one of its ranks
// (--load-balance-method; the scheduler's choose_rank applies it).
#pragma once

#include <string>

namespace megactx {

// How data-parallel attention pins a new request to a rank, among the ranks
// where its first chunk fits now (SGLang's --load-balance-method, plus the
// default): CacheAware, the rank whose prefix cache holds the longest prefix
// of it, then the fewest running requests, then the most free pages;
// RoundRobin, the next rank in turn (a rotation advanced by each admission);
// ShortestQueue, the fewest running requests, then the most free pages;
// MinimumTokens, the fewest tokens (prompt and output so far) of running
// requests, then the most free pages. Ties go to the lowest rank.
enum class DpLoadBalance { CacheAware, RoundRobin, ShortestQueue, MinimumTokens };

// The --load-balance-method names: cache_aware, round_robin, shortest_queue,
// minimum_tokens; throws megactx::Error naming them for anything else.
DpLoadBalance parse_dp_load_balance(const std::string& name);
const char* dp_load_balance_name(DpLoadBalance method);

}  // namespace megactx
