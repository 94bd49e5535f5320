// serve --tensor-parallel-size N: the other ranks of the serving group as
// child processes of the server, one per rank, started before any thread of
// the server (they are forked). Each loads its share of the model and repeats
// the leader's forwards (model/group_model.h); the server process is rank 0,
// whose engine and HTTP front serve every request.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/model_loader.h"
#include "parallel/communicator.h"

namespace megactx::cli {

class ServeGroup {
 public:
  // Forks ranks 1 .. size - 1 (each loads `model_dir` with `load` and its
  // group, then serves the leader until it stops) and joins the group as
  // rank 0. Errors: the group does not assemble (a child that failed to load
  // logs why on stderr and exits 1).
  ServeGroup(int size, const std::string& model_dir, const ModelLoadOptions& load);
  // Closes rank 0's connections and waits for the children (the leader's
  // model has stopped them, or they see the connections close).
  ~ServeGroup();
  ServeGroup(const ServeGroup&) = delete;
  ServeGroup& operator=(const ServeGroup&) = delete;

  parallel::Communicator& communicator() { return *communicator_; }

 private:
  // A worker that exits while the group serves takes the others with it:
  // the watcher ends them (SIGTERM), so that no rank waits in a collective
  // for a peer that will never come (a collective of the survivors need not
  // touch the dead rank's connection, and a write to it can still succeed),
  // and rank 0's next or current collective fails with the group's error.
  void watch_children();
  std::unique_ptr<parallel::Communicator> communicator_;
  std::vector<pid_t> children_;
  std::string folder_;  // the rendezvous folder, removed with the group
  std::atomic<bool> stopping_{false};
  int wake_[2] = {-1, -1};  // a pipe: the destructor wakes the watcher
  std::thread watcher_;
};

}  // namespace megactx::cli
