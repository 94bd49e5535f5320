// Submitting the engine requests that answer one HTTP request together: the
// n choices of an OpenAI request, the prompts of a /generate batch, the n
// parallel samples of a /generate prompt.
#pragma once

#include <functional>
#include <vector>

#include "engine/request.h"
#include "server/http_types.h"
#include "server/server_state.h"

namespace megactx::server {

// Submits every request; updates of requests[i] reach on_update(i, update).
// A client disconnect aborts the whole group, since nobody is left to read
// any of its results. The callers check capacity before.
//
// `leaders` (empty, or one entry per request): leaders[i] >= 0 holds request
// i back until request leaders[i] sent its first update, i.e. its prompt is
// computed and its full pages are in the prefix cache, so samples of one
// prompt prefill it once and share its KV instead of computing it n times.
void submit_request_group(ServerState& state, ResponseChannel& channel,
                          const std::vector<const GenerationRequest*>& requests,
                          const std::function<void(size_t, const RequestUpdate&)>& on_update,
                          const std::vector<int64_t>& leaders = {});

// leaders for groups of `n` consecutive samples of one prompt: each group's
// first request leads the others.
std::vector<int64_t> sample_group_leaders(size_t requests, size_t n);

}  // namespace megactx::server
