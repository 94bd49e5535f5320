// The torch helper's process handling, without torch: an interpreter that
// cannot start or that exits without answering is an error naming the group
// and the rank (or the reader), never a hang. A member joined to a real
// torch.distributed group and the reader of real payloads are tested end to
// end (tests/e2e/trainer_loop_test.py).
#include "io/torch_helper.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>

#include "core/error.h"

namespace megactx {
namespace {

TorchGroupJoin test_join(const std::string& python) {
  TorchGroupJoin join;
  join.python = python;
  join.master_address = "127.0.0.1";
  join.master_port = 1;
  join.rank = 1;
  join.world_size = 2;
  join.group_name = "g";
  join.backend = "gloo";
  join.timeout_s = 5;
  return join;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(TorchHelper, AnInterpreterThatCannotStartIsAnError) {
  const std::string error = error_of([] { TorchHelper::start(test_join("/nonexistent/python3")); });
  EXPECT_NE(error.find("cannot start '/nonexistent/python3'"), std::string::npos) << error;
  EXPECT_NE(error.find("--weight-update-python"), std::string::npos) << error;
}

TEST(TorchHelper, AMemberThatExitsWithoutAnswerIsAnErrorAtOnce) {
  // /bin/sh runs the Python text as a shell script, which fails at once.
  auto member = TorchHelper::start(test_join("/bin/sh"));
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { member->wait_ready(); });
  EXPECT_NE(error.find("weight-update group 'g', rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("exited without an answer"), std::string::npos) << error;
  EXPECT_NE(error.find("stderr"), std::string::npos) << error;  // the shell's complaint
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  EXPECT_FALSE(member->alive());
  member->destroy(1);  // nothing left to do, and no hang
}

TEST(TorchHelper, AReaderThatExitsWithoutAnswerIsAnError) {
  auto reader = TorchHelper::start_reader("/bin/sh", "cpu", 5);
  const std::string error = error_of([&] { reader->wait_ready(); });
  EXPECT_NE(error.find("the weight-update tensor reader"), std::string::npos) << error;
  EXPECT_NE(error.find("exited without an answer"), std::string::npos) << error;
}

TEST(TorchHelper, KillEndsAMemberBlockedInTheRendezvous) {
  // A real member (Python with torch) whose rendezvous host accepts the
  // connection and never answers: it would wait out its timeout; kill() must
  // end the wait at once. (A destroyed group or a shutting-down server does this.)
  if (std::system("python3 -c 'import torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 has no torch here (Debian: apt-get install python3-torch)";
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  TorchGroupJoin join = test_join("python3");
  join.master_port = ntohs(address.sin_port);
  join.timeout_s = 600;
  auto member = TorchHelper::start(join);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // torch imported, connected
    member->kill();
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { member->wait_ready(); });
  killer.join();
  ::close(listener);
  EXPECT_NE(error.find("exited without an answer"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(TorchHelper, AnnouncedDtypesAreTorchNames) {
  EXPECT_EQ(announced_tensor("w", "bfloat16", {2, 3}).dtype, DType::BF16);
  EXPECT_EQ(announced_tensor("w", "torch.float32", {2}).dtype, DType::F32);
  EXPECT_EQ(announced_tensor("w", "float", {}).torch_dtype, "float32");
  EXPECT_EQ(announced_tensor("w", "half", {1}).dtype, DType::F16);
  EXPECT_EQ(announced_tensor("w", "torch.float8_e4m3fn", {1}).dtype, DType::F8_E4M3);
  const std::string error = error_of([] { announced_tensor("layer.w", "int64", {1}); });
  EXPECT_NE(error.find("layer.w"), std::string::npos) << error;
  EXPECT_NE(error.find("'int64'"), std::string::npos) << error;
  EXPECT_THROW(announced_tensor("w", "float32", {-1}), Error);
}

TEST(TorchHelper, TheScriptIsCompiledIn) {
  const std::string_view script = torch_helper_script();
  EXPECT_NE(script.find("_new_process_group_helper"), std::string_view::npos);
  EXPECT_NE(script.find("PR_SET_PDEATHSIG"), std::string_view::npos);
  EXPECT_NE(script.find("class PayloadUnpickler"), std::string_view::npos);
}

}  // namespace
}  // namespace megactx
