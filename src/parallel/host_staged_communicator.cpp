// HostStagedCommunicator: device data through host memory over a CPU group
// (host_staged_communicator.h). Every call: wait for the stream (earlier
// kernels wrote the data), copy to a host buffer, collective, copy back and
// wait again (the host buffer is reused by the next call).
#include "parallel/host_staged_communicator.h"

#include <cstdint>
#include <vector>

#include "core/error.h"

#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace megactx::parallel {

#if MEGACTX_HAVE_CUDA
namespace {

void check_cuda(cudaError_t result, const char* what) {
  MEGACTX_CHECK(result == cudaSuccess, "host-staged communicator: {}: {}", what,
                cudaGetErrorString(result));
}

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(Communicator& host, std::unique_ptr<Communicator> owned,
                         cudaStream_t stream)
      : host_(host), owned_(std::move(owned)), stream_(stream) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void all_reduce(float* data, int64_t count, ReduceOp op) override {
    MEGACTX_CHECK(count >= 0, "host-staged all_reduce: negative count {}", count);
    if (count == 0) return;
    uint8_t* staged = to_host(data, count * sizeof(float), in_);
    host_.all_reduce(reinterpret_cast<float*>(staged), count, op);
    from_host(data, staged, count * sizeof(float));
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    MEGACTX_CHECK(bytes >= 0, "host-staged all_gather: negative size {}", bytes);
    if (bytes == 0) return;
    uint8_t* staged = to_host(in, bytes, in_);
    out_.resize(static_cast<size_t>(bytes * size()));
    host_.all_gather(staged, out_.data(), bytes);
    from_host(out, out_.data(), bytes * size());
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    MEGACTX_CHECK(bytes >= 0, "host-staged broadcast: negative size {}", bytes);
    if (bytes == 0) return;
    uint8_t* staged = to_host(data, bytes, in_);
    host_.broadcast(staged, bytes, root);
    from_host(data, staged, bytes);
  }

  void all_to_all(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                  const std::vector<int64_t>& recv_bytes) override {
    int64_t sent = 0, received = 0;
    for (int64_t b : send_bytes) sent += b;
    for (int64_t b : recv_bytes) received += b;
    MEGACTX_CHECK(sent >= 0 && received >= 0, "host-staged all_to_all: negative counts");
    uint8_t* staged = to_host(in, sent, in_);
    out_.resize(static_cast<size_t>(received));
    host_.all_to_all(staged, send_bytes, out_.data(), recv_bytes);
    from_host(out, out_.data(), received);
  }

  void barrier() override {
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    host_.barrier();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> part = host_.split(color, key);
    Communicator& ref = *part;
    return std::make_unique<HostStagedCommunicator>(ref, std::move(part), stream_);
  }

 private:
  // The device bytes [bytes] at `device` in `buffer` (after the stream's
  // earlier work); a null pointer is fine for zero bytes.
  uint8_t* to_host(const void* device, int64_t bytes, std::vector<uint8_t>& buffer) {
    buffer.resize(static_cast<size_t>(bytes));
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (bytes > 0) copy(buffer.data(), device, bytes, cudaMemcpyDeviceToHost);
    return buffer.data();
  }
  void from_host(void* device, const uint8_t* host, int64_t bytes) {
    if (bytes > 0) copy(device, host, bytes, cudaMemcpyHostToDevice);
  }
  // On the stream and waited for: the next kernel on it sees the data (a
  // plain cudaMemcpy from pageable memory may return before its DMA ends,
  // and the model's stream does not wait for the legacy stream), and the
  // host buffer is free again.
  void copy(void* to, const void* from, int64_t bytes, cudaMemcpyKind kind) {
    check_cuda(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), kind, stream_),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  Communicator& host_;
  std::unique_ptr<Communicator> owned_;  // a split's host group; null for the caller's
  cudaStream_t stream_ = nullptr;
  std::vector<uint8_t> in_, out_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_communicator(Communicator& host_group,
                                                            void* stream) {
  return std::make_unique<HostStagedCommunicator>(host_group, nullptr,
                                                  static_cast<cudaStream_t>(stream));
}

#else  // a build without CUDA

std::unique_ptr<Communicator> make_host_staged_communicator(Communicator&, void*) {
  MEGACTX_CHECK(false, "host-staged communicator: megactx was built without CUDA");
  return nullptr;
}

#endif

}  // namespace megactx::parallel
