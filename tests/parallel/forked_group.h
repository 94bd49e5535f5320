// A parallel group of forked processes on loopback for the tests of
// tests/parallel: one rank per child, each checking its own results.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace megactx::parallel {

// A fresh rendezvous folder per group.
inline std::string rendezvous_folder() {
  static int groups = 0;
  const auto folder =
      std::filesystem::temp_directory_path() /
      ("megactx_rendezvous_" + std::to_string(::getpid()) + "_" + std::to_string(groups++));
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder.string();
}

// Runs body(communicator) in `size` forked processes, one rank each; a child
// exits 0 when body returns true (a failed check prints why and returns
// false; an exception is printed). Anything with threads (a model's thread
// pool) must be made inside body: threads do not survive fork().
inline void run_forked_group(int size, const std::function<bool(Communicator&)>& body,
                             std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
  const std::string folder = rendezvous_folder();
  std::vector<pid_t> children;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) {
      int status = 1;
      try {
        CpuCommunicatorOptions options;
        options.rank = rank;
        options.size = size;
        options.rendezvous_dir = folder;
        options.timeout = timeout;
        auto communicator = make_cpu_communicator(options);
        // Every rank's side of the mesh is up before any rank may finish
        // (a rank whose body returns at once would otherwise close its
        // connections while another is still making them).
        communicator->barrier();
        status = body(*communicator) ? 0 : 1;
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(status);
    }
    children.push_back(child);
  }
  for (size_t rank = 0; rank < children.size(); ++rank) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[rank], &status, 0), children[rank]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " failed";
  }
  std::filesystem::remove_all(folder);
}

}  // namespace megactx::parallel
