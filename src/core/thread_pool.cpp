#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <exception>

namespace megactx {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

namespace {
void run_chunk(const std::function<void(int64_t, int64_t)>& body, int64_t count, int parts, int index) {
  const int64_t begin = count * index / parts;
  const int64_t end = count * (index + 1) / parts;
  if (begin < end) body(begin, end);
}
}  // namespace

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const auto* body = body_;
    const int64_t count = count_;
    lock.unlock();
    std::exception_ptr error;
    try {
      run_chunk(*body, count, size(), index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    body(0, count);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    count_ = count;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr error;
  try {
    run_chunk(body, count, size(), 0);
  } catch (...) {
    error = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  if (!error) error = error_;
  body_ = nullptr;
  if (error) std::rethrow_exception(error);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* text = std::getenv("MEGACTX_THREADS")) return std::max(1, std::atoi(text));
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

}  // namespace megactx
