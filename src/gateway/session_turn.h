// One chat request of a gateway session, end to end:
//  1. planned like any chat request (chat_request.h), then matched against
//     the session (history_match.h): the prompt ids are the recorded ids of
//     the trace it continues or forks, plus the tokens of what the client
//     added since, so the engine's own tokens are never re-tokenized (and
//     the prefix cache serves the shared history); a rewritten history is
//     tokenized afresh as a new trace;
//  2. generated whole, with logprobs, whatever the client asked;
//  3. every tool call screened by the guard; in intercept mode a confirmed
//     hack is answered by a virtual tool result (rendered by the chat
//     template after the call, as a tool message would be) and the model's
//     next turn is generated and returned instead (up to
//     GatewayConfig::max_intercepts_per_turn times);
//  4. recorded as a turn (trajectory.h) and answered (turn_response.h).
// An engine error answers 400 and records nothing; a bad request is a 400
// before anything is recorded.
#pragma once

#include <memory>

#include "server/http_types.h"

namespace megactx::gateway {

class Gateway;

// Throws ApiError for what is wrong before any engine work.
void run_session_turn(Gateway& gateway, const server::HttpRequest& request,
                      std::shared_ptr<server::ResponseChannel> channel);

}  // namespace megactx::gateway
