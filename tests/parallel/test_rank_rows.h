// RankRows (model/group_model.h) over a forked test group, for the tests of
// engine/rank_sampler.h: a command is one broadcast word from rank 0 (round
// + 1: the workers run serve_own_rows on that round's logits; 0: stop), as
// the serving group's command header is; data-parallel rank s is held by
// group rank s x `tensor`.
#pragma once

#include <cstdint>
#include <functional>

#include "model/group_model.h"
#include "parallel/communicator.h"

namespace megactx::testing {

class TestRankRows final : public RankRows {
 public:
  TestRankRows(parallel::Communicator& group, int tensor) : group_(group), tensor_(tensor) {}
  void run(const std::function<void(parallel::Communicator&)>& body) override {
    int64_t command = round + 1;
    group_.broadcast(&command, sizeof(command), 0);
    ++runs;
    body(group_);
  }
  int holder(int share) const override { return share * tensor_; }
  // Rank 0: the workers' loop ends.
  void stop() {
    int64_t command = 0;
    group_.broadcast(&command, sizeof(command), 0);
  }
  int runs = 0;       // commands sent
  int64_t round = 0;  // what the next command names

 private:
  parallel::Communicator& group_;
  int tensor_;
};

// A worker's loop: `serve(round)` for each command until rank 0 stops.
inline void serve_test_commands(parallel::Communicator& group,
                                const std::function<void(int64_t round)>& serve) {
  for (;;) {
    int64_t command = 0;
    group.broadcast(&command, sizeof(command), 0);
    if (command == 0) return;
    serve(command - 1);
  }
}

}  // namespace megactx::testing
