#include "server/request_group.h"

#include <memory>
#include <mutex>
#include <string>

namespace megactx::server {

namespace {

// Requests waiting for their leader, shared by the callbacks of the group.
struct HeldBack {
  std::mutex mutex;
  std::vector<std::vector<size_t>> followers;  // [leader] requests it holds back
  std::vector<bool> released;                  // [leader] followers submitted
  bool cancelled = false;                      // the client went away
};

}  // namespace

std::vector<int64_t> sample_group_leaders(size_t requests, size_t n) {
  std::vector<int64_t> leaders(requests, -1);
  if (n <= 1) return leaders;
  for (size_t i = 0; i < requests; ++i)
    if (i % n != 0) leaders[i] = static_cast<int64_t>(i - i % n);
  return leaders;
}

void submit_request_group(ServerState& state, ResponseChannel& channel,
                          const std::vector<const GenerationRequest*>& requests,
                          const std::function<void(size_t, const RequestUpdate&)>& on_update,
                          const std::vector<int64_t>& leaders) {
  std::vector<std::string> rids;
  for (const GenerationRequest* request : requests) rids.push_back(request->rid);
  auto held = std::make_shared<HeldBack>();
  held->followers.resize(requests.size());
  held->released.assign(requests.size(), false);
  // The requests themselves, for the followers submitted later.
  auto copies = std::make_shared<std::vector<GenerationRequest>>();
  for (const GenerationRequest* request : requests) copies->push_back(*request);
  for (size_t i = 0; i < leaders.size(); ++i)
    if (leaders[i] >= 0) held->followers[static_cast<size_t>(leaders[i])].push_back(i);

  channel.on_disconnect([&state, rids, held] {
    {
      std::lock_guard lock(held->mutex);
      held->cancelled = true;
    }
    for (const auto& rid : rids) state.engine().abort(rid);
  });
  // A leader's first update submits its followers; a follower submitted
  // after the client left is aborted at once (the abort above missed it).
  auto submit_leader = [&state, on_update, held, copies](size_t i) {
    state.submit((*copies)[i], [on_update, held, copies, &state, i](const RequestUpdate& update) {
      std::vector<size_t> release;
      bool cancelled = false;
      {
        std::lock_guard lock(held->mutex);
        if (!held->released[i]) {
          held->released[i] = true;
          release = held->followers[i];
        }
        cancelled = held->cancelled;
      }
      for (size_t follower : release) {
        state.submit((*copies)[follower], [on_update, follower](const RequestUpdate& u) {
          on_update(follower, u);
        });
        if (cancelled) state.engine().abort((*copies)[follower].rid);
      }
      on_update(i, update);
    });
  };
  for (size_t i = 0; i < requests.size(); ++i)
    if (leaders.empty() || leaders[i] < 0) submit_leader(i);
}

}  // namespace megactx::server
