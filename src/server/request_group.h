// Submitting the engine requests that answer one HTTP request together: the
// n choices of an OpenAI request, the prompts of a /generate batch.
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
void submit_request_group(ServerState& state, ResponseChannel& channel,
                          const std::vector<const GenerationRequest*>& requests,
                          const std::function<void(size_t, const RequestUpdate&)>& on_update);

}  // namespace megactx::server
