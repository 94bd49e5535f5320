// Collectives between the ranks of a parallel group (tensor, expert or data
// parallel): the one interface the parallel model code is written against,
// with a CPU implementation over Gloo (processes on loopback TCP: the same
// parallel code runs under CTest on one machine) and, on GPUs, NCCL. Buffers
// are the implementation's memory: host memory for the CPU communicator.
//
// Every call is collective: all ranks of the group make the same calls in
// the same order with matching sizes. A rank that does not arrive within the
// group's timeout makes the call fail with megactx::Error (never a hang).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megactx::parallel {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data [count] becomes op over every rank's data [count], on every rank.
  virtual void all_reduce(float* data, int64_t count, ReduceOp op) = 0;
  // out [size * bytes] = every rank's in [bytes], in rank order.
  virtual void all_gather(const void* in, void* out, int64_t bytes) = 0;
  // data [bytes] of rank `root` on every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // Rank r sends send_bytes[q] bytes to rank q, taken from `in` in rank order
  // (q = 0 first), and receives recv_bytes[q] bytes from rank q into `out`, in
  // rank order: the dispatch and combine of expert parallelism. send_bytes[q]
  // of rank r must equal recv_bytes[r] of rank q. Zero counts are allowed.
  virtual void all_to_all(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) = 0;
  virtual void barrier() = 0;
  // The ranks that pass the same `color` form a new group, ranked by `key`
  // (ties by rank in this group): MPI_Comm_split / ncclCommSplit. Collective
  // over this group; the new group's calls are independent of this one's (a
  // 2D layout: context-parallel rows over tensor-parallel heads).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// How a CPU communicator finds its group: every rank names the same
// rendezvous folder (a shared file store; each rank writes its address there)
// and group name, and its own rank in 0 .. size - 1.
struct CpuCommunicatorOptions {
  int rank = 0;
  int size = 1;
  std::string rendezvous_dir;  // existing folder shared by the ranks
  std::string group = "megactx";
  std::string host = "127.0.0.1";            // the interface this rank listens on
  std::chrono::milliseconds timeout{30000};  // to assemble the group
  // How long a collective may wait for the other ranks once the group is up
  // (0: `timeout`). A server's workers wait for the next step as long as the
  // server idles, so they set a long one; a rank that exits is noticed at once
  // (its connections close) whatever the timeout.
  std::chrono::milliseconds collective_timeout{0};
};

// Connects to every other rank of the group (a full mesh of TCP pairs);
// megactx::Error on bad options or when the group does not assemble in time.
std::unique_ptr<Communicator> make_cpu_communicator(const CpuCommunicatorOptions& options);

}  // namespace megactx::parallel
