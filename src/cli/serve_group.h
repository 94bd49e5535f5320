// serve --tensor-parallel-size N: the other ranks of the serving group as
// child processes of the server, one per rank, started before any thread of
// the server (they are forked). Each loads its share of the model and repeats
// the leader's forwards (model/group_model.h); the server process is rank 0,
// whose engine and HTTP front serve every request.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
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
  std::unique_ptr<parallel::Communicator> communicator_;
  std::vector<pid_t> children_;
  std::string folder_;  // the rendezvous folder, removed with the group
};

}  // namespace megactx::cli
