#include "server/request_group.h"

#include <string>

namespace megactx::server {

void submit_request_group(ServerState& state, ResponseChannel& channel,
                          const std::vector<const GenerationRequest*>& requests,
                          const std::function<void(size_t, const RequestUpdate&)>& on_update) {
  std::vector<std::string> rids;
  for (const GenerationRequest* request : requests) rids.push_back(request->rid);
  channel.on_disconnect([&state, rids] {
    for (const auto& rid : rids) state.engine().abort(rid);
  });
  for (size_t i = 0; i < requests.size(); ++i)
    state.submit(*requests[i],
                 [on_update, i](const RequestUpdate& update) { on_update(i, update); });
}

}  // namespace megactx::server
