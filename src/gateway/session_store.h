// The sessions the gateway records, bounded in count and in estimated bytes.
// When a new session or a recorded turn would pass a bound, finished
// sessions are evicted first, oldest finish first; a session idle for
// StoreLimits::idle_seconds counts as finished. Active sessions are never
// evicted: when they alone fill the store, new sessions and turns get 503
// (the trainer collects and finishes or deletes sessions to make room).
// Thread-safe: the store's mutex guards the index, each session's own mutex
// its contents.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gateway/gateway_config.h"
#include "gateway/trajectory.h"

namespace megactx::gateway {

// A session and what eviction reads without taking its mutex. Never call
// into the store while holding `mutex` (the store takes it after its own).
struct StoredSession {
  std::mutex mutex;
  Session session;  // guarded by mutex
  std::atomic<bool> finished{false};
  std::atomic<int64_t> finished_at{0};  // steady-clock nanoseconds
  std::atomic<int64_t> last_active{0};  // steady-clock nanoseconds
  std::atomic<int> in_flight{0};        // turns being answered (never evicted then)
};

struct StoreStats {
  int64_t sessions = 0;
  int64_t bytes = 0;
  int64_t evicted = 0;   // sessions evicted so far
  int64_t rejected = 0;  // requests refused with 503 because the store was full
};

class SessionStore {
 public:
  explicit SessionStore(StoreLimits limits);

  // The session `id`, created when new (with `parent_id` and `rollout_id`;
  // an empty rollout id inherits the parent's, else is the session id).
  // Throws ApiError 400 when an existing session has another parent or
  // rollout, 503 when the store is full. The session comes back with one
  // turn in flight (not evictable, reopened if finished): the caller
  // decrements StoredSession::in_flight when the turn is over.
  std::shared_ptr<StoredSession> open(const std::string& id, const std::string& parent_id,
                                      const std::string& rollout_id);
  // Null when unknown (or evicted).
  std::shared_ptr<StoredSession> find(const std::string& id) const;
  // After a session changed (its lock released): re-estimates its bytes and
  // evicts what the bounds require. Throws nothing.
  void update_size(const std::shared_ptr<StoredSession>& stored);
  // Before recording `extra` bytes more: 503 when even eviction cannot make room.
  void reserve(size_t extra);

  // The sessions of a rollout (or one session when `session_id` is given),
  // in creation order.
  std::vector<std::shared_ptr<StoredSession>> select(const std::string& rollout_id,
                                                     const std::string& session_id) const;
  // Every session, in creation order.
  std::vector<std::shared_ptr<StoredSession>> all() const;
  // Marks them finished (evictable); returns how many.
  int64_t finish(const std::string& rollout_id, const std::string& session_id);
  // Removes them; returns how many.
  int64_t remove(const std::string& rollout_id, const std::string& session_id);

  StoreStats stats() const;
  const StoreLimits& limits() const { return limits_; }

 private:
  bool evictable(const StoredSession& stored, int64_t now) const;
  // Evicts finished (or idle) sessions, oldest first, until `bytes` more and
  // `sessions` more fit; false when they do not.
  bool make_room(size_t bytes, int64_t sessions);

  StoreLimits limits_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<StoredSession>> sessions_;
  std::map<std::string, size_t> bytes_;  // per session, as last updated
  std::vector<std::string> order_;       // creation order
  size_t total_bytes_ = 0;
  int64_t evicted_ = 0, rejected_ = 0;
};

}  // namespace megactx::gateway
