// The NCCL communicator's checks that need no GPU (tests/cuda_parallel runs its
// collectives on the GPU machine): bad ranks and a missing bootstrap group are
// errors before NCCL is loaded, a library that does not exist is reported as
// unavailable with the reason, and a build without CUDA says so.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "parallel/nccl_communicator.h"

namespace megactx::parallel {
namespace {

TEST(NcclOptions, BadGroupsAreErrorsBeforeNcclLoads) {
  NcclCommunicatorOptions options;
  options.library = "/nonexistent/libnccl.so.2";
  options.size = 0;
  EXPECT_THROW(make_nccl_communicator(options), Error);
  options.size = 2;
  options.rank = 2;
  EXPECT_THROW(make_nccl_communicator(options), Error);
  options.rank = 1;  // two ranks, no bootstrap group for the unique id
  // A build without CUDA refuses every communicator before any check.
  std::string why;
  nccl_available(options.library, &why);
  const bool without_cuda = why.find("built without CUDA") != std::string::npos;
  try {
    make_nccl_communicator(options);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(without_cuda ? "built without CUDA" : "bootstrap"),
              std::string::npos)
        << error.what();
  }
}

TEST(NcclOptions, AMissingLibraryIsUnavailableWithTheReason) {
  std::string why;
  EXPECT_FALSE(nccl_available("/nonexistent/libnccl.so.2", &why));
  EXPECT_FALSE(why.empty());
  NcclCommunicatorOptions options;
  options.library = "/nonexistent/libnccl.so.2";
  EXPECT_THROW(make_nccl_communicator(options), Error);
}

}  // namespace
}  // namespace megactx::parallel
