#include "cli/serve_group.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "engine/cuda_sampler.h"
#include "engine/rank_sampler.h"
#include "model/group_model.h"

namespace megactx::cli {
namespace {

constexpr std::chrono::milliseconds kAssembleTimeout{300000};  // every rank loads the model first
// Workers wait for the next step as long as the server idles (a week: Gloo
// keeps milliseconds in 32 bits); an exited rank is noticed at once anyway.
constexpr std::chrono::milliseconds kStepTimeout{7LL * 24 * 3600 * 1000};

parallel::CpuCommunicatorOptions group_options(int rank, int size, const std::string& folder) {
  parallel::CpuCommunicatorOptions options;
  options.rank = rank;
  options.size = size;
  options.rendezvous_dir = folder;
  options.group = "serve";
  options.timeout = kAssembleTimeout;
  options.collective_timeout = kStepTimeout;
  return options;
}

[[noreturn]] void run_worker(int rank, int size, const std::string& folder,
                             const std::string& model_dir, ModelLoadOptions load) {
  // A worker must not outlive its server, whatever ends the server (and the
  // server blocks SIGTERM for its signal thread: unblock it here).
  sigset_t all;
  sigfillset(&all);
  ::sigprocmask(SIG_UNBLOCK, &all, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  int status = 1;
  try {
    auto communicator = parallel::make_cpu_communicator(group_options(rank, size, folder));
    communicator->barrier();  // every rank is connected
    load.group = communicator.get();
    // A tensor-parallel worker's logits are the leader's too and nobody reads
    // them: left on the device, no copy per step. Data-parallel ranks sample
    // their rows there (engine/rank_sampler.h), and copy them to the host
    // only for a step that gathers every row on the leader.
    load.cuda.logits_on_device = true;
    auto model = load_language_model(model_dir, load);
    // Data-parallel attention: this rank samples the rows it computed
    // (engine/rank_sampler.h), with the sampler rank 0's engine would use.
    const std::unique_ptr<Sampler> sampler = make_sampler(*model, load.deterministic);
    run_group_worker(*model, *communicator, load.data_parallel_size,
                     [&](const Tensor& own_logits, parallel::Communicator& group) {
                       serve_own_rows(own_logits, *sampler, group);
                     });
    status = 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "serve: rank %d of %d: %s\n", rank, size, error.what());
  }
  std::fflush(stderr);
  ::_exit(status);
}

}  // namespace

ServeGroup::ServeGroup(int size, const std::string& model_dir, const ModelLoadOptions& load) {
  MEGACTX_CHECK(size >= 2, "a serving group of {} ranks", size);
  char pattern[] = "/tmp/megactx-group-XXXXXX";
  MEGACTX_CHECK(::mkdtemp(pattern) != nullptr, "serve: cannot make a rendezvous folder in /tmp");
  const std::string folder = pattern;
  folder_ = folder;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int rank = 1; rank < size; ++rank) {
    const pid_t child = ::fork();
    MEGACTX_CHECK(child >= 0, "serve: fork for rank {} failed", rank);
    if (child == 0) run_worker(rank, size, folder, model_dir, load);
    children_.push_back(child);
  }
  try {
    communicator_ = parallel::make_cpu_communicator(group_options(0, size, folder));
    communicator_->barrier();
  } catch (...) {
    for (const pid_t child : children_) ::kill(child, SIGTERM);
    for (const pid_t child : children_) ::waitpid(child, nullptr, 0);
    std::filesystem::remove_all(folder);
    throw;
  }
  // The folder stays while the group lives: the models split the group
  // (Communicator::split: context shares of tensor-parallel ranks) through it.
}

ServeGroup::~ServeGroup() {
  // Closing rank 0's connections ends a worker that still waits for a
  // command (when the server failed before its model could stop them).
  communicator_.reset();
  for (const pid_t child : children_) ::waitpid(child, nullptr, 0);
  std::error_code ignored;
  std::filesystem::remove_all(folder_, ignored);
}

}  // namespace megactx::cli
