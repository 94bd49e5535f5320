// DeviceBuffer: one cudaMalloc'd allocation with RAII, grow-only for scratch
// (the CUDA model reuses its buffers from step to step); PinnedBuffer, its
// page-locked host counterpart for staging. Only included by
// CUDA builds (MEGACTX_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

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
  // (model/cuda_decode_graph.h).
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
