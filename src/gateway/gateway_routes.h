// The gateway's HTTP routes: what a trainer reads and manages.
//
//   GET  /gateway/sessions[?rollout_id=R]          one line per session
//   GET  /gateway/session?session_id=S[&prompt_ids=1]
//                                                  turns token-in/token-out and samples
//   GET  /gateway/samples?rollout_id=R|session_id=S[&finish=1][&text=1]
//                                                  JSONL, one slime Sample per trace
//   POST /gateway/finish {"rollout_id"|"session_id"}  marks sessions finished (evictable)
//   POST /gateway/delete {"rollout_id"|"session_id"}  removes them
//   POST /gateway/screen {"tool", "arguments", "messages"?, "judge"?}
//                                                  the guard's view of one call
//   GET  /gateway/rules                            the rules, mode and judge in effect
#pragma once

#include "server/router.h"

namespace megactx::gateway {

class Gateway;

void add_gateway_routes(server::Router& router, Gateway& gateway);

}  // namespace megactx::gateway
