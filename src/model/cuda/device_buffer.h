// DeviceBuffer: one cudaMalloc'd allocation with RAII, grow-only for scratch
// (the CUDA model reuses its buffers from step to step); PinnedBuffer, its
// page-locked host counterpart for staging. Only included by
// CUDA builds (MEGACTX_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { ensure(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Grows to at least `bytes` (contents are not kept).
  void ensure(size_t bytes) {
    if (bytes <= bytes_) return;
    release();
    MEGACTX_CUDA_CHECK(cudaMalloc(&data_, bytes));
    bytes_ = bytes;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // Sized for `count` elements of T; returns the typed pointer.
  template <typename T>
  T* get(int64_t count) {
    ensure(static_cast<size_t>(count > 0 ? count : 1) * sizeof(T));
    return as<T>();
  }
  size_t bytes() const { return bytes_; }

  // How many DeviceBuffer allocations were freed so far (growth, move-assign,
  // destruction), process-wide. A captured CUDA Graph holds the addresses of
  // the scratch it was captured with: a change since its capture means some
  // buffer may have moved, and the graph is captured again
  // (model/cuda/decode_graph.h).
  static uint64_t releases() { return releases_.load(std::memory_order_relaxed); }

 private:
  void release() {
    if (data_ != nullptr) {
      cudaFree(data_);
      releases_.fetch_add(1, std::memory_order_relaxed);
    }
    data_ = nullptr;
    bytes_ = 0;
  }
  static inline std::atomic<uint64_t> releases_{0};
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory, grow-only (contents are not kept): staging of
// per-step uploads and readbacks, so those copies are truly asynchronous.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      if (data_ != nullptr) MEGACTX_CUDA_CHECK(cudaFreeHost(data_));
      data_ = nullptr;
      bytes_ = 0;
      MEGACTX_CUDA_CHECK(cudaMallocHost(&data_, bytes));
      bytes_ = bytes;
    }
    return data_;
  }
  // Sized for `count` elements of T (at least one).
  template <typename T>
  T* get(size_t count) {
    return static_cast<T*>(get((count > 0 ? count : 1) * sizeof(T)));
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Device buffers handed out as Tensors the caller owns (the logits a forward
// returns on the device): a released tensor's buffer goes back to the pool
// instead of cudaFree (which would synchronise the device every step). The
// pool's state outlives the model if a tensor does. Reuse is safe in stream
// order: the next forward writes a recycled buffer on the model's stream,
// after whatever the previous owner enqueued there (the CudaSampler), and
// host readers (to_host) synchronise the device first.
class DeviceTensorPool {
 public:
  DeviceTensorPool() : state_(std::make_shared<State>()) {}
  // A float32 device tensor of `shape` (uninitialised).
  Tensor take(std::vector<int64_t> shape) {
    size_t bytes = sizeof(float);
    for (int64_t d : shape) bytes *= static_cast<size_t>(d > 0 ? d : 1);
    void* data = nullptr;
    {
      std::lock_guard lock(state_->mutex);
      auto& free = state_->free;
      // Smallest free buffer that fits.
      size_t best = free.size();
      for (size_t i = 0; i < free.size(); ++i) {
        if (free[i].first >= bytes && (best == free.size() || free[i].first < free[best].first))
          best = i;
      }
      if (best < free.size()) {
        data = free[best].second;
        bytes = free[best].first;
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(best));
      }
    }
    if (data == nullptr) MEGACTX_CUDA_CHECK(cudaMalloc(&data, bytes));
    std::shared_ptr<State> state = state_;
    return Tensor::adopt(data, std::move(shape), DType::F32, Device::CUDA,
                         [state, bytes](void* pointer) {
                           std::lock_guard lock(state->mutex);
                           state->free.emplace_back(bytes, pointer);
                         });
  }

 private:
  struct State {
    std::mutex mutex;
    std::vector<std::pair<size_t, void*>> free;  // (capacity, buffer)
    ~State() {
      for (auto& [bytes, pointer] : free) cudaFree(pointer);
    }
  };
  std::shared_ptr<State> state_;
};

// Host vector -> device buffer (grown as needed), on `stream`.
template <typename T>
T* upload(DeviceBuffer& buffer, const std::vector<T>& values, cudaStream_t stream) {
  T* device = buffer.get<T>(static_cast<int64_t>(values.size()));
  if (!values.empty()) {
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(device, values.data(), values.size() * sizeof(T),
                                       cudaMemcpyHostToDevice, stream));
  }
  return device;
}

}  // namespace megactx::cuda
