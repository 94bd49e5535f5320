#include "cli/serve_group.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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
                     [&](const Tensor& own_logits, std::span<const int64_t> command,
                         parallel::Communicator& group) {
                       serve_own_rows(own_logits, command, *sampler, group);
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
  MEGACTX_CHECK(::pipe(wake_) == 0, "serve: cannot make the group watcher's pipe");
  watcher_ = std::thread([this] { watch_children(); });
}

void ServeGroup::watch_children() {
  // One pidfd per worker (readable once it exits; nothing is reaped here:
  // the destructor waits for the children) and the wake pipe last. A worker
  // that exits 0 was stopped by the leader (the server is ending): not a
  // failure.
  std::vector<pollfd> fds;
  std::vector<pid_t> watched;
  for (const pid_t child : children_) {
#ifdef SYS_pidfd_open
    const auto fd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
#else
    const int fd = -1;  // headers older than Linux 5.3: the worker is not watched
#endif
    if (fd < 0) continue;
    fds.push_back({fd, POLLIN, 0});
    watched.push_back(child);
  }
  fds.push_back({wake_[0], POLLIN, 0});
  bool failed = false;
  while (!failed && !stopping_.load() && fds.size() > 1) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    // Backwards over the workers (the wake pipe stays last): an exited one
    // is dropped in place.
    for (size_t i = watched.size(); i-- > 0 && !failed;) {
      if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      siginfo_t info{};
      const bool stopped =
          ::waitid(P_PID, static_cast<id_t>(watched[i]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == watched[i] && info.si_code == CLD_EXITED && info.si_status == 0;
      ::close(fds[i].fd);
      fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
      watched.erase(watched.begin() + static_cast<std::ptrdiff_t>(i));
      failed = !stopped;
    }
  }
  if (failed && !stopping_.load()) {
    std::fprintf(stderr, "serve: a worker of the group failed; ending the others\n");
    for (const pid_t child : children_) ::kill(child, SIGTERM);
  }
  for (size_t i = 0; i < watched.size(); ++i) ::close(fds[i].fd);
}

ServeGroup::~ServeGroup() {
  stopping_.store(true);
  if (wake_[1] >= 0) {
    const char byte = 0;
    [[maybe_unused]] const ssize_t written = ::write(wake_[1], &byte, 1);
  }
  if (watcher_.joinable()) watcher_.join();
  for (const int fd : wake_)
    if (fd >= 0) ::close(fd);
  // Closing rank 0's connections ends a worker that still waits for a
  // command (when the server failed before its model could stop them).
  communicator_.reset();
  for (const pid_t child : children_) ::waitpid(child, nullptr, 0);
  std::error_code ignored;
  std::filesystem::remove_all(folder_, ignored);
}

}  // namespace megactx::cli
