// RankRows (model/group_model.h) over a forked test group, for the tests of
// engine/rank_sampler.h: a command is two broadcast words from rank 0 (round
// + 1: the workers run serve_own_rows on that round's logits, 0: stop; the
// payload's word count), then the payload, as the serving group's commands
// are; data-parallel rank s is held by group rank s x `tensor`.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/group_model.h"
#include "parallel/communicator.h"

namespace megactx::testing {

class TestRankRows final : public RankRows {
 public:
  TestRankRows(parallel::Communicator& group, int tensor) : group_(group), tensor_(tensor) {}
  void run(std::span<const int64_t> payload,
           const std::function<void(parallel::Communicator&)>& body) override {
    int64_t command[2] = {round + 1, static_cast<int64_t>(payload.size())};
    group_.broadcast(command, sizeof(command), 0);
    if (!payload.empty())
      group_.broadcast(const_cast<int64_t*>(payload.data()),
                       static_cast<int64_t>(payload.size_bytes()), 0);
    ++runs;
    body(group_);
  }
  int holder(int share) const override { return share * tensor_; }
  // Rank 0: the workers' loop ends.
  void stop() {
    int64_t command[2] = {0, 0};
    group_.broadcast(command, sizeof(command), 0);
  }
  int runs = 0;       // commands sent
  int64_t round = 0;  // what the next command names

 private:
  parallel::Communicator& group_;
  int tensor_;
};

// A worker's loop: `serve(round, payload)` for each command until rank 0
// stops.
inline void serve_test_commands(
    parallel::Communicator& group,
    const std::function<void(int64_t round, std::span<const int64_t> payload)>& serve) {
  for (;;) {
    int64_t command[2] = {0, 0};
    group.broadcast(command, sizeof(command), 0);
    if (command[0] == 0) return;
    std::vector<int64_t> payload(static_cast<size_t>(command[1]));
    if (!payload.empty())
      group.broadcast(payload.data(), static_cast<int64_t>(payload.size() * sizeof(int64_t)), 0);
    serve(command[0] - 1, payload);
  }
}

}  // namespace megactx::testing
