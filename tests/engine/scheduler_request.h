// A hand-made request for the scheduler tests: `prompt_len` token ids from
// `base` (base + i % 1000, so two requests with one base share a prefix),
// generating without a limit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/request_state.h"

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

}  // namespace megactx
