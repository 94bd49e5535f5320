// The CPU communicator with 1, 2 and 4 ranks as separate processes on
// loopback (forked from the test), each checking every collective against
// the values it can compute alone; a group whose other rank never comes is
// an error within the timeout, not a hang.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "forked_group.h"
#include "parallel/communicator.h"

namespace megactx::parallel {
namespace {

#define CHECK_OR_FAIL(condition, ...)                         \
  do {                                                        \
    if (!(condition)) {                                       \
      std::fprintf(stderr, "rank %d: ", communicator.rank()); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      return false;                                           \
    }                                                         \
  } while (0)

// Rank r's value at index i of a test vector: known to every rank.
float value_of(int rank, int64_t i) {
  return static_cast<float>((rank + 1) * 1000 + i % 997);
}

bool every_collective(Communicator& communicator) {
  const int size = communicator.size(), rank = communicator.rank();
  // all_reduce, sum and max, over sizes that are and are not multiples of anything.
  for (const int64_t count : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{1} << 20}) {
    std::vector<float> data(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) data[i] = value_of(rank, i);
    communicator.all_reduce(data.data(), count, ReduceOp::Sum);
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += value_of(r, i);
      CHECK_OR_FAIL(data[i] == want, "all_reduce sum [%lld] %f != %f", (long long)i, data[i], want);
    }
    for (int64_t i = 0; i < count; ++i)
      data[i] = rank == size - 1 && i % 3 == 0 ? 1e9f : -1.f * rank;
    communicator.all_reduce(data.data(), count, ReduceOp::Max);
    for (int64_t i = 0; i < count; ++i)  // rank 0's -0 is the largest of the rest (== 0)
      CHECK_OR_FAIL(data[i] == (i % 3 == 0 ? 1e9f : 0.f), "all_reduce max [%lld] %f", (long long)i,
                    data[i]);
  }
  // all_gather of 5 bytes per rank.
  std::vector<uint8_t> mine(5), all(5 * size);
  for (int i = 0; i < 5; ++i) mine[i] = static_cast<uint8_t>(rank * 16 + i);
  communicator.all_gather(mine.data(), all.data(), 5);
  for (int r = 0; r < size; ++r)
    for (int i = 0; i < 5; ++i)
      CHECK_OR_FAIL(all[r * 5 + i] == r * 16 + i, "all_gather rank %d byte %d", r, i);
  // broadcast from the last rank.
  std::vector<int32_t> shared(1000, rank == size - 1 ? 42 : -rank);
  communicator.broadcast(shared.data(), 4000, size - 1);
  for (const int32_t v : shared) CHECK_OR_FAIL(v == 42, "broadcast got %d", v);
  // all_to_all with ragged counts (rank r sends (r + q) % 3 ints to q, some zero).
  std::vector<int64_t> send(size), recv(size);
  std::vector<int32_t> in, out;
  for (int q = 0; q < size; ++q) {
    send[q] = 4 * ((rank + q) % 3);
    recv[q] = 4 * ((q + rank) % 3);
    for (int k = 0; k < (rank + q) % 3; ++k) in.push_back(rank * 100 + q * 10 + k);
  }
  int64_t total = 0;
  for (const int64_t bytes : recv) total += bytes / 4;
  out.assign(static_cast<size_t>(total), -1);
  communicator.all_to_all(in.data(), send, out.data(), recv);
  size_t at = 0;
  for (int q = 0; q < size; ++q)
    for (int k = 0; k < (q + rank) % 3; ++k, ++at)
      CHECK_OR_FAIL(out[at] == q * 100 + rank * 10 + k, "all_to_all from %d item %d: %d", q, k,
                    out[at]);
  communicator.barrier();
  // Bad arguments are errors on the calling rank, before any traffic.
  bool refused = false;
  try {
    communicator.broadcast(shared.data(), 4, size);
  } catch (const megactx::Error&) {
    refused = true;
  }
  CHECK_OR_FAIL(refused, "a broadcast root outside the group was accepted");
  communicator.barrier();
  return true;
}

TEST(CpuCommunicator, EveryCollectiveWithOneRank) {
  run_forked_group(1, every_collective);
}
TEST(CpuCommunicator, EveryCollectiveWithTwoRanks) {
  run_forked_group(2, every_collective);
}
TEST(CpuCommunicator, EveryCollectiveWithFourRanks) {
  run_forked_group(4, every_collective);
}

// A group of 4 split two ways (rows of 2 by rank / 2, ranked in reverse
// order; columns by rank % 2): each new group reduces and gathers over its
// members only, in its own rank order, and the parent group still works.
bool splits_into_independent_groups(Communicator& group) {
  const int me = group.rank();
  auto rows = group.split(me / 2, -me);
  auto columns = group.split(me % 2, me);
  bool ok = rows->size() == 2 && rows->rank() == 1 - me % 2 && columns->size() == 2 &&
            columns->rank() == me / 2;
  float sum = static_cast<float>(me + 1);
  rows->all_reduce(&sum, 1, ReduceOp::Sum);
  ok &= sum == static_cast<float>(me / 2 == 0 ? 1 + 2 : 3 + 4);
  int32_t ranks[2] = {};
  columns->all_gather(&me, ranks, sizeof me);
  ok &= ranks[0] == me % 2 && ranks[1] == me % 2 + 2;
  float total = 1.0f;
  group.all_reduce(&total, 1, ReduceOp::Sum);
  ok &= total == 4.0f;
  auto alone = group.split(me, 0);  // every rank its own group
  ok &= alone->size() == 1 && alone->rank() == 0;
  return ok;
}

TEST(CpuCommunicator, SplitGroupsAreIndependent) {
  run_forked_group(4, splits_into_independent_groups);
}

TEST(CpuCommunicator, AMissingRankIsAnErrorNotAHang) {
  // Rank 0 of a group of two alone: the rendezvous gives up after the timeout.
  const std::string folder = rendezvous_folder();
  CpuCommunicatorOptions options;
  options.rank = 0;
  options.size = 2;
  options.rendezvous_dir = folder;
  options.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(make_cpu_communicator(options), megactx::Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  std::filesystem::remove_all(folder);
}

TEST(CpuCommunicator, BadOptionsAreErrors) {
  CpuCommunicatorOptions options;
  options.rank = 2;
  options.size = 2;
  options.rendezvous_dir = std::filesystem::temp_directory_path().string();
  EXPECT_THROW(make_cpu_communicator(options), megactx::Error);
  options.rank = 0;
  options.rendezvous_dir = "/nonexistent/megactx/rendezvous";
  EXPECT_THROW(make_cpu_communicator(options), megactx::Error);
}

}  // namespace
}  // namespace megactx::parallel
