// A fixed pool of worker threads with a blocking parallel_for: the CPU backend
// splits rows of a GEMM or heads of an attention over it. One pool per process.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace megactx {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) on disjoint chunks covering [0, count), on the pool
  // and the calling thread; returns when all are done. Exceptions propagate.
  void parallel_for(int64_t count, const std::function<void(int64_t, int64_t)>& body);

  // The process-wide pool (hardware_concurrency threads, or MEGACTX_THREADS).
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace megactx
