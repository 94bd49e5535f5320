// The CPU communicator: Gloo's collectives over its TCP transport, the group
// assembled through a file store. Gloo reports failures (a peer that closed,
// a timeout) as exceptions of its own; they become megactx::Error here.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "parallel/communicator.h"

namespace megactx::parallel {
namespace {

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const CpuCommunicatorOptions& options) : options_(options) {
    MEGACTX_CHECK(options.size >= 1 && options.rank >= 0 && options.rank < options.size,
                  "communicator: rank {} outside a group of {}", options.rank, options.size);
    MEGACTX_CHECK(std::filesystem::is_directory(options.rendezvous_dir),
                  "communicator: rendezvous folder '{}' does not exist", options.rendezvous_dir);
    MEGACTX_CHECK(options.timeout.count() > 0, "communicator: the timeout must be positive");
    guarded("connecting", [&] {
      gloo::transport::tcp::attr attributes;
      attributes.hostname = options.host;
      device_ = gloo::transport::tcp::CreateDevice(attributes);
      gloo::rendezvous::FileStore store(options.rendezvous_dir);
      gloo::rendezvous::PrefixStore prefixed(options.group, store);
      context_ = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
      context_->setTimeout(options.timeout);
      context_->connectFullMesh(prefixed, device_);
      if (options.collective_timeout.count() > 0) context_->setTimeout(options.collective_timeout);
    });
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  void all_reduce(float* data, int64_t count, ReduceOp op) override {
    MEGACTX_CHECK(count >= 0, "all_reduce: negative count {}", count);
    if (count == 0 || size() == 1) return;
    guarded("all_reduce", [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data, static_cast<size_t>(count));
      using Reduce = void (*)(void*, const void*, const void*, size_t);
      options.setReduceFunction(op == ReduceOp::Sum ? static_cast<Reduce>(&gloo::sum<float>)
                                                    : static_cast<Reduce>(&gloo::max<float>));
      options.setTag(next_tag());
      gloo::allreduce(options);
    });
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    MEGACTX_CHECK(bytes >= 0, "all_gather: negative size {}", bytes);
    if (bytes == 0) return;
    guarded("all_gather", [&] {
      gloo::AllgatherOptions options(context_);
      options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)),
                       static_cast<size_t>(bytes));
      options.setOutput(static_cast<uint8_t*>(out), static_cast<size_t>(bytes) * size());
      options.setTag(next_tag());
      gloo::allgather(options);
    });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    MEGACTX_CHECK(bytes >= 0, "broadcast: negative size {}", bytes);
    MEGACTX_CHECK(root >= 0 && root < size(), "broadcast: root {} outside a group of {}", root,
                  size());
    if (bytes == 0 || size() == 1) return;
    guarded("broadcast", [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(static_cast<uint8_t*>(data), static_cast<size_t>(bytes));
      options.setRoot(root);
      options.setTag(next_tag());
      gloo::broadcast(options);
    });
  }

  void all_to_all(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                  const std::vector<int64_t>& recv_bytes) override {
    MEGACTX_CHECK(static_cast<int>(send_bytes.size()) == size() &&
                      static_cast<int>(recv_bytes.size()) == size(),
                  "all_to_all: {} send and {} receive counts for a group of {}", send_bytes.size(),
                  recv_bytes.size(), size());
    for (size_t q = 0; q < send_bytes.size(); ++q)
      MEGACTX_CHECK(send_bytes[q] >= 0 && recv_bytes[q] >= 0,
                    "all_to_all: a negative count for rank {}", q);
    const int64_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0});
    const int64_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
    // Gloo's buffers may not be null even when empty: a one-byte stand-in.
    uint8_t empty = 0;
    uint8_t* input = sent > 0 ? const_cast<uint8_t*>(static_cast<const uint8_t*>(in)) : &empty;
    uint8_t* output = received > 0 ? static_cast<uint8_t*>(out) : &empty;
    guarded("all_to_all", [&] {
      gloo::AlltoallvOptions options(context_);
      options.setInput(input, send_bytes);
      options.setOutput(output, recv_bytes);
      options.setTag(next_tag());
      gloo::alltoallv(options);
    });
  }

  void barrier() override {
    if (size() == 1) return;
    guarded("barrier", [&] {
      gloo::BarrierOptions options(context_);
      options.setTag(next_tag());
      gloo::barrier(options);
    });
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    // Every rank's (color, key), then a new group through the same store
    // under a name of its own: this group's name, the split's ordinal (the
    // same on every rank: splits are collective) and the color.
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(static_cast<size_t>(2 * size()));
    all_gather(mine, all.data(), sizeof mine);
    std::vector<int> members;  // ranks of this group in the new one, in its order
    for (int r = 0; r < size(); ++r)
      if (all[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    CpuCommunicatorOptions options = options_;
    options.rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    options.size = static_cast<int>(members.size());
    options.group = fmt::format("{}/split{}/color{}", options_.group, splits_++, color);
    return std::make_unique<GlooCommunicator>(options);
  }

 private:
  // Every collective of a group has its own tag, the same on every rank
  // (collectives are called in the same order everywhere).
  uint32_t next_tag() { return tag_++; }

  template <class Body>
  void guarded(const char* what, Body&& body) {
    try {
      body();
    } catch (const megactx::Error&) {
      throw;
    } catch (const std::exception& error) {
      throw megactx::Error(fmt::format("communicator {}: {}", what, error.what()));
    }
  }

  CpuCommunicatorOptions options_;  // how this group assembled (split() reuses the store)
  int splits_ = 0;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_cpu_communicator(const CpuCommunicatorOptions& options) {
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace megactx::parallel
